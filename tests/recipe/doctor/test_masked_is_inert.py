"""The doctor's masked-is-inert rule: one-step off-policy RL in minibatches without
recompute_old_logprobs keeps π_old = the sampler's log-probs, so masked IS never masks (w = 1);
the recipe fields around it (sampler_precision's backend, the step hash) say what they do."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.data.content_hash import step_hash
from stagewise.data.errors import BadInput
from stagewise.flows import rl
from stagewise.recipe import load_recipe
from stagewise.recipe.doctor import diagnose

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"


def findings(tmp_path: Path, *sets: str) -> list:
    loaded = load_recipe(TINY, [f"workdir={tmp_path / 'work'}", *sets])
    return [f for f in diagnose(loaded) if f.rule == "masked-is-inert"]


def test_off_policy_minibatches_without_recompute_warn_on_rl_and_the_teacher_trained_from_it(tmp_path):
    rl_f, teacher = findings(tmp_path, "stages.rl.rollout.off_policy=true")  # the demo's 2 minibatches
    assert (rl_f.field, rl_f.severity, rl_f.stage, rl_f.value) == ("stages.rl.rollout", "warning", "rl", 2)
    assert "w = 1" in rl_f.message and "off_policy: false" in rl_f.message
    assert "recompute_old_logprobs: true" in rl_f.message
    assert "tiny.yaml:" in rl_f.where  # the rollout line
    # distillation's `format` teacher is stages.rl's block with overrides: the same training, its own stage
    assert (teacher.field, teacher.stage) == ("stages.distill.teachers[1].rl", "distill")


@pytest.mark.parametrize("sets", [
    [],  # the demo: synchronous
    ["stages.rl.rollout.off_policy=true", "stages.rl.rollout.recompute_old_logprobs=true"],
    ["stages.rl.rollout.off_policy=true", "stages.rl.rollout.minibatches=1"],  # w carries the staleness
])
def test_no_warning_where_masked_is_acts(tmp_path, sets):
    assert findings(tmp_path, *sets) == []


def test_a_teachers_own_rollout_override_is_judged(tmp_path):
    [f] = findings(tmp_path, "stages.distill.teachers[1].rl.rollout.off_policy=true")
    assert f.field == "stages.distill.teachers[1].rl" and "teacher 'format'" in f.message


def _rl_hash(*sets: str) -> str:
    r = load_recipe(TINY, list(sets)).recipe
    return step_hash("rl", rl.rl_spec(rl.select(r), r.seed), ["start", "rows"])


def test_sampler_precision_enters_the_rl_step_hash_and_trainer_leaves_it_as_it_was():
    assert _rl_hash("stages.rl.rollout.sampler_precision=bf16") != _rl_hash()
    assert _rl_hash("stages.rl.rollout.sampler_precision=trainer") == _rl_hash()
    assert "sampler_precision" not in rl.rl_spec(rl.select(load_recipe(TINY).recipe), 0)["stage"]["rollout"]


def test_synchronous_minibatches_mark_the_trainers_pi_old_in_the_hash():
    spec = lambda *s: rl.rl_spec(rl.select(load_recipe(TINY, list(s)).recipe), 0)  # noqa: E731
    assert spec()["old_logprobs"] == "trainer"  # the demo: synchronous, 2 minibatches
    assert "old_logprobs" not in spec("stages.rl.rollout.off_policy=true")
    assert "old_logprobs" not in spec("stages.rl.rollout.minibatches=1")


@pytest.mark.parametrize("sets", [["stages.rl.backend=vllm"], ["stages.distill.backend=vllm"]])
def test_a_bf16_sampler_is_refused_where_a_server_samples(sets):
    block = sets[0].split(".")[1]
    with pytest.raises(BadInput, match="sampler_precision"):
        load_recipe(TINY, [*sets, f"stages.{block}.rollout.sampler_precision=bf16"])
