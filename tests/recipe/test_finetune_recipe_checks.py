"""recipes/finetune.yaml: what it keeps of tiny.yaml and what it drops, the blend it fine-tunes on (a slice
of every demo domain reassigned to the team's), and the tokenizer quantize reads the validation text with
when no stage of the recipe trains one. Training it is tests/e2e/test_finetune_recipe.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.data.sft_blend import add_domain, normalise
from stagewise.recipe import load_recipe
from stagewise.recipe.schema import STAGE_ORDER

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
FINETUNE, TINY = RECIPES / "finetune.yaml", RECIPES / "tiny.yaml"


def test_it_starts_from_a_checkpoint_and_runs_sft_then_rl_then_quantize():
    r = load_recipe(FINETUNE).recipe
    assert (r.name, r.model.from_, r.model.preset) == ("finetune", "/path/to/post-trained-checkpoint", None)
    assert [s for s in STAGE_ORDER if getattr(r.stages, s) is not None] == ["sft", "rl", "quantize"]
    assert [s.name for s in r.stages.sft.data.sources] == ["my_domain", "arithmetic", "calculator", "sorting",
                                                          "lookup", "format"]
    assert [s.name for s in r.stages.rl.data.sources] == ["my_domain"]  # RL on the team's rows alone
    assert r.stages.rl.data.world is None and r.stages.rl.domains is None
    assert [s.name for s in r.stages.sft.stages] == ["domain"] and r.stages.sft.stages[0].blend.reasoning_off_fraction == 0.5


def test_the_blend_is_tinys_with_a_fifth_of_every_domain_reassigned_to_the_teams():
    """tiny.yaml's stage 1: arithmetic 6, format 3, sorting 1, calculator 1, lookup 1 (of 12). Each keeps
    0.8 of its share: 6/12 x 0.8 = 0.4, 3/12 x 0.8 = 0.2, 1/12 x 0.8 = 0.0667; my_domain gets the 0.2 freed."""
    tiny = load_recipe(TINY).recipe.stages.sft.stages[0].blend.weights
    shares = normalise(load_recipe(FINETUNE).recipe.stages.sft.stages[0].blend.weights)
    third = 0.8 / 12
    assert shares == pytest.approx({"my_domain": 0.2, "arithmetic": 0.4, "format": 0.2, "sorting": third,
                                    "calculator": third, "lookup": third})
    assert shares == pytest.approx(add_domain(tiny, "my_domain", 0.2))  # the library's slice, the same numbers


def test_quantize_reads_the_validation_text_with_the_start_checkpoints_tokenizer(tmp_path, monkeypatch):
    """No stage trains a tokenizer here, so the validation text is tokenized with model.from's (resolved
    where the run starts); a tokenizer.path given wins, and a recipe that pretrains keeps the BPE it trains."""
    from stagewise.flows.quantize import select

    monkeypatch.chdir(tmp_path)
    assert select(load_recipe(FINETUNE, ["model.from=ckpt"]).recipe).tokenizer.path == str(tmp_path / "ckpt")
    assert select(load_recipe(FINETUNE, ["model.from=ckpt", "tokenizer.path=/tok"]).recipe).tokenizer.path == "/tok"
    assert select(load_recipe(TINY, ["model.from=/ckpt"]).recipe).tokenizer.path is None
