"""A workdir trained before the code moved under `stagewise` reuses every step after the move.

The golden file holds the step hashes of every stage of the shipped recipes as the code before
the move (commit 6b85975, top-level `flows`, `tasks`, ...) computed them, from the same spec
functions on the same fixed upstream hash. A hash that changes here retrains that stage in every
existing workdir: when that is intended (what a stage trains changed), bump the stage's version
and regenerate the file, saying so in the commit. The recipes are frozen copies (golden/recipes/,
the shipped ones as of 994c0b0): what this pins is the code's hashing, and a shipped recipe that
changes its own blocks retrains those stages by design.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagewise.data.content_hash import step_hash
from stagewise.data.long_context import long_context_blend
from stagewise.flows import distill, long_context, merge, pretrain, quantize, rl, sft
from stagewise.model.config import TrainConfig
from stagewise.model.runtime import Runtime
from stagewise.recipe import load_recipe
from stagewise.recipe.blocks.on_policy import block_spec

REPO = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((Path(__file__).parent / "golden" / "step_hashes_before_import_root.json").read_text())
UPSTREAM = ["i"]
FROZEN = Path(__file__).parent / "golden" / "recipes"


def stage_hashes(recipe_name: str) -> dict[str, str]:
    """Every stage's step hash for a shipped recipe, each on the same stand-in upstream hash."""
    r = load_recipe(FROZEN / f"{recipe_name}.yaml").recipe
    out = {}
    b = pretrain.select(r)
    train = pretrain.train_config(b.stage, Runtime().precision_for(b.stage.precision))
    out["pretrain"] = step_hash("pretrain", pretrain.pretrain_spec(b, train, r.seed), UPSTREAM)
    out["merge"] = step_hash("merge", merge.merge_spec(merge.select(r), r.seed), UPSTREAM)
    b = long_context.select(r)
    blend = long_context_blend(b.stage.data, b.phase2_blend)
    out["long_context"] = step_hash("long_context", long_context.long_context_spec(b, b.stage.train_config(), blend,
                                                                                  r.seed), UPSTREAM)
    b = sft.select(r)
    for sub in b.stage.stages:
        train = TrainConfig.model_validate(sub.model_dump(include=set(TrainConfig.model_fields)))
        suite = b.suites.get(sub.gate.suite if sub.gate else sub.eval_suite) if (sub.gate or sub.eval_suite) else None
        out[f"sft.{sub.name}"] = step_hash("sft-x", sft.substage_spec(sub, train, b.mtp, suite, 40, r.seed), UPSTREAM)
    out["rl"] = step_hash("rl", rl.rl_spec(rl.select(r), r.seed), UPSTREAM)
    b = distill.select(r)
    spec = {"stage": block_spec(b.stage, {"vllm_url", "data"}), "data": b.data.model_dump(),
            "rl": block_spec(b.rl, set()) if b.rl else None, "suite": b.suites.get(b.stage.eval_suite or ""),
            "seed": r.seed, "version": distill.DISTILL_VERSION}
    out["distill"] = step_hash("distill", spec, UPSTREAM)
    not_trained = {"vllm_url", "rounds", "eval_suite", "eval_limit", "retention_margin", "data"}
    spec = {"stage": block_spec(b.stage, not_trained), "data": b.data.model_dump(), "seed": r.seed,
            "version": distill.DISTILL_VERSION}
    out["distill-round"] = step_hash("distill-round", spec, UPSTREAM)
    out["quantize"] = step_hash("quantize", quantize.quantize_spec(quantize.select(r), r.seed), UPSTREAM)
    return out


@pytest.mark.parametrize("recipe_name", sorted(GOLDEN))
def test_every_stage_keeps_the_step_hash_it_had_before_the_move(recipe_name):
    assert stage_hashes(recipe_name) == GOLDEN[recipe_name]


def test_a_changed_block_changes_its_hash():
    """The comparison above can fail: the RL block with one more step is another step."""
    r = load_recipe(FROZEN / "tiny.yaml", ["stages.rl.steps=162"]).recipe
    assert step_hash("rl", rl.rl_spec(rl.select(r), r.seed), UPSTREAM) != GOLDEN["tiny"]["rl"]
