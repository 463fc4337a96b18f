"""Which recipe fields change each stage's step hash (and so retrain), and which do not.

A field that changes what a stage trains or hands on must change its directory (else a rerun
silently reuses stale weights); an evaluation-only or bookkeeping field must not (else a
rerun retrains for nothing). One table per stage, Marin-style.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.data.content_hash import step_hash
from stagewise.flows import long_context, merge, pretrain, quantize, sft
from stagewise.model.runtime import Runtime
from stagewise.recipe import load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def _pretrain(sets, runtime=Runtime()):
    r = load_recipe(TINY, sets).recipe
    block = pretrain.select(r)
    train = pretrain.train_config(block.stage, runtime.precision_for(block.stage.precision))
    return step_hash("pretrain", pretrain.pretrain_spec(block, train, r.seed), ["data-digest"])


BASE = _pretrain([])


@pytest.mark.parametrize("change", [
    "data.sources[0].max_epochs=2",
    "stages.pretrain.optimizer.lr=1e-3",
    "stages.pretrain.phases[0].until=0.7",
    "stages.pretrain.phases[0].blend={stdlib: 1.0}",
    "seed=7",
    "model.overrides={hidden_size: 96}",
    "stages.pretrain.gate={all: [{metric: eval/validation/loss, op: '<', value: 3.0}], eval_every_tokens: 245760, suite: chat}",
])
def test_pretrain_retrains_when_what_it_trains_changes(change):
    assert _pretrain([change]) != BASE, change


@pytest.mark.parametrize("change", [
    "data.sources[0].quality=low",
    "stages.pretrain.val_tokens=1024",
    "stages.pretrain.eval_suite=chat",
    "workdir=/elsewhere",
    "tracking.uri=http://127.0.0.1:5000",
    "runtime.device=cpu",
    "stages.merge.windows_tokens=[122880]",
])
def test_pretrain_is_reused_when_only_evaluation_or_bookkeeping_changes(change):
    assert _pretrain([change]) == BASE, change


def test_precision_is_part_of_the_pretraining_step():
    assert _pretrain([], Runtime(device="cpu", precision="bf16")) != BASE
    assert _pretrain(["stages.pretrain.precision=bf16"]) == _pretrain([], Runtime(device="cpu", precision="bf16"))


def test_a_gate_brings_its_evaluation_into_the_pretraining_step():
    gate = "stages.pretrain.gate={all: [{metric: eval/validation/loss, op: '<', value: 3.0}], eval_every_tokens: 245760, suite: chat}"
    assert _pretrain([gate, "stages.pretrain.val_tokens=1024"]) != _pretrain([gate])


def _merge(sets):
    r = load_recipe(TINY, sets).recipe
    return step_hash("merge", merge.merge_spec(merge.select(r), r.seed), ["ckpt-a", "ckpt-b"])


@pytest.mark.parametrize("change,retrains", [
    ("stages.merge.windows_tokens=[122880]", True),
    ("stages.merge.schedule=linear", True),
    ("stages.merge.min_improvement=0.1", True),
    ("stages.merge.val_tokens=1024", True),
    ("stages.pretrain.seq_length=128", True),
    ("workdir=/elsewhere", False),
    ("stages.sft.eval_limit=5", False),
])
def test_merge_decision_follows_its_whole_block(change, retrains):
    assert (_merge([change]) != _merge([])) == retrains, change


def _long_context(sets):
    r = load_recipe(TINY, sets).recipe
    block = long_context.select(r)
    train = block.stage.train_config()
    from stagewise.data.long_context import long_context_blend

    blend = long_context_blend(block.stage.data, block.phase2_blend)
    return step_hash("long_context", long_context.long_context_spec(block, train, blend, r.seed), ["base", "data"])


@pytest.mark.parametrize("change,retrains", [
    ("stages.long_context.tokens=98304", True),
    ("stages.pretrain.phases[1].blend={stdlib: 1.0}", True),
    ("stages.long_context.optimizer.lr=1e-4", True),
    ("stages.long_context.needle_per_length=4", True),  # in the block: conservative
    ("workdir=/elsewhere", False),
    ("stages.pretrain.val_tokens=1024", False),
])
def test_long_context_step(change, retrains):
    assert (_long_context([change]) != _long_context([])) == retrains, change


def _substage(sets, index=0):
    r = load_recipe(TINY, sets).recipe
    block = sft.select(r)
    sub = block.stage.stages[index]
    from stagewise.model.config import TrainConfig

    train = TrainConfig.model_validate(sub.model_dump(include=set(TrainConfig.model_fields)))
    suite = block.suites.get(sub.gate.suite if sub.gate else sub.eval_suite) if (sub.gate or sub.eval_suite) else None
    return step_hash("sft-x", sft.substage_spec(sub, train, block.mtp, suite, 40, r.seed), ["start", "packs"])


@pytest.mark.parametrize("change,retrains", [
    ("stages.sft.stages[0].optimizer.lr=1e-4", True),
    ("stages.sft.stages[0].normalization=conversation", True),
    ("stages.sft.stages[0].max_epochs=1", True),
    ("stages.sft.stages[0].lora={r: 4, alpha: 8}", True),
    ("stages.sft.eval_limit=5", False),
    ("stages.sft.stages[1].optimizer.lr=1e-4", False),  # another sub-stage
    ("workdir=/elsewhere", False),
])
def test_sft_substage_step(change, retrains):
    assert (_substage([change]) != _substage([])) == retrains, change


def test_quality_retrains_only_when_a_phase_weighs_by_it():
    tiered = "stages.pretrain.phases[1]={name: quality, until: 1.0, quality_weights: {high: 3, medium: 1}}"
    assert _pretrain([tiered, "data.sources[4].quality=high"]) != _pretrain([tiered])
    assert _pretrain(["data.sources[4].quality=high"]) == BASE


def _quantize(sets):
    r = load_recipe(TINY, sets).recipe
    return step_hash("quantize", quantize.quantize_spec(quantize.select(r), r.seed), ["start-weights", "data", "-", "heldout"])


@pytest.mark.parametrize("change, reruns", [
    ("stages.quantize.effective_bits=5.0", True),
    ("stages.quantize.budget=flops", True),
    ("stages.quantize.keep_bf16=[lm_head]", True),
    ("stages.quantize.pins=[{pattern: '*.mixer.experts', format: fp8}]", True),
    ("stages.quantize.calib_batches=4", True),
    ("stages.quantize.heldout_limit=50", True),   # the scores it hands on change
    ("eval.chat=[world_arithmetic]", True),       # its suite's tasks
    ("seed=7", True),
    ("workdir=/elsewhere", False),
    ("runtime.device=cpu", False),
    ("stages.pretrain.optimizer.lr=1e-3", False),  # reaches it only through the start checkpoint's weights
])
def test_quantize_step(change, reruns):
    assert (_quantize([change]) != _quantize([])) == reruns, change
