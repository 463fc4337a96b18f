"""The `stages.rl` block: the shipped recipe validates, and a broken block names its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.flows.registry import registered
from stagewise.flows.rl import select
from stagewise.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"


def problems(*overrides: str) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(TINY, list(overrides))
    return str(info.value)


def test_the_shipped_rl_block_validates_and_selects():
    recipe = load_recipe(TINY).recipe
    block = select(recipe)
    assert block is not None and block.stage.steps > 0
    assert block.stage.loss.temperature == block.stage.rollout.temperature
    assert registered("rl").start == "handed_on"


def test_an_unknown_environment_is_named_with_the_known_ones():
    text = problems("stages.rl.data.sources[0].environment=exact_anwser")
    assert "stages.rl.data.sources[0].environment" in text and "exact_answer" in text


def test_world_paths_need_the_world_and_a_file_it_writes():
    assert "rl_eval.jsonl is the held-out set" in problems("stages.rl.data.sources[0].path=\"@world/rl_eval.jsonl\"")
    assert "writes no 'rl_arith.jsonl'" in problems("stages.rl.data.sources[0].path=\"@world/rl_arith.jsonl\"")
    assert "need a `world` block" in problems("stages.rl.data.world=null")


def test_a_second_temperature_is_refused():
    assert "grpo.temperature must equal rollout.temperature" in problems("stages.rl.loss.temperature=0.5")


def test_a_domain_share_must_be_positive():
    assert "stages.rl.domains.arithmetic" in problems("stages.rl.domains={arithmetic: 0, format: 1}")


def test_vllm_rollouts_refuse_nccl_off_cuda_and_a_missing_vllm_naming_the_key(monkeypatch, tmp_path):
    from stagewise.data.errors import BadInput
    from stagewise.flows.rl import refuse_backend

    def rl(*overrides: str):
        return select(load_recipe(TINY, ["stages.rl.backend=vllm", *overrides]).recipe).stage

    nccl = rl("stages.rl.vllm_weight_sync=nccl", "stages.rl.vllm_url=\"http://127.0.0.1:8000\"")
    with pytest.raises(BadInput, match="stages.rl.vllm_weight_sync: nccl broadcasts weights from a CUDA device"):
        refuse_backend(nccl, "cpu", "stages.rl")
    refuse_backend(nccl, "cuda:0", "stages.rl")
    refuse_backend(rl("stages.rl.vllm_url=\"http://127.0.0.1:8000\""), "cpu", "stages.rl")  # files, a given server
    monkeypatch.setenv("STAGEWISE_VLLM_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(BadInput, match=r"stages.distill.backend: vllm with no vllm_url starts a vLLM server .*"
                                       r"STAGEWISE_VLLM_PYTHON=.*no-python: no such file; .*dev.py vllm-env"):
        refuse_backend(rl(), "cpu", "stages.distill")
    refuse_backend(select(load_recipe(TINY).recipe).stage, "cpu", "stages.rl")  # backend hf: nothing to refuse
    assert "give its vllm_url" in problems("stages.rl.backend=vllm", "stages.rl.vllm_weight_sync=nccl")


def test_settings_that_would_do_nothing_are_refused():
    assert "reprofile only changes what a curriculum samples" in problems("stages.rl.reprofile={window: 5}")
    assert "only applies to off_policy" in problems("stages.rl.rollout.off_policy=false",
                                                     "stages.rl.rollout.recompute_old_logprobs=true")


def test_minibatches_must_divide_the_steps_and_fit_a_group():
    assert "must be a multiple of rollout.minibatches" in problems("stages.rl.rollout.minibatches=3")
    assert "must be <= group_size" in problems("stages.rl.rollout.minibatches=32", "stages.rl.steps=64")
    block = select(load_recipe(TINY, ["stages.rl.rollout.minibatches=2"]).recipe)
    assert block.stage.rollout.minibatches == 2


def test_a_curriculum_without_a_difficulty_profile_is_refused_and_the_default_one_dropped():
    text = problems("stages.rl.filter=null", "stages.rl.curriculum={sigma: 0.2}")
    assert "stages.rl" in text and "`filter: null` profiles nothing" in text
    from stagewise.recipe.blocks.rl import RLStage

    stage = select(load_recipe(TINY).recipe).stage.model_dump(by_alias=True, exclude={"curriculum"})
    assert RLStage.model_validate({**stage, "filter": None}).curriculum is None  # no profile: no default curriculum
    assert RLStage.model_validate(stage).curriculum is not None  # profiled: the default curriculum stands
