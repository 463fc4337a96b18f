"""`engine: megatron`: what pretraining and long context hand Megatron-Bridge, and what they get back.

Pretraining: the prepared shards are written once more as Megatron indexed datasets
(data/megatron_indexed.py, beside the prepared data as `<workdir>/data/<digest>-megatron/`), and
each phase is one training launch with that phase's blend (`dataset.blend`), all under one
schedule: a launch trains until its phase's end step (`train.train_iters`) and the next one
resumes from its save (`checkpoint.load` = `checkpoint.save`), so the LR schedule, the optimizer
and the step count run on across the switch as in our engine. Megatron restarts its data stream
at the switch (our engine keeps its cursor); the blend changes either way.

Long context: one launch at the block's single length, from the stage's input checkpoint
(imported through the HF bridge first).

Either way the last save is exported through the HF bridge against a template directory (the
input checkpoint, or for pretraining from a preset its config and the prepared tokenizer) and
adopted as our checkpoint by flows/launched.run_engine.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from data.megatron_indexed import write_indexed_dir
from data.prepare import PreparedData
from data.shards import TokenShard
from flows.launched import EnginePlan, EngineStep
from model.config import ModelConfig, TrainConfig
from model.scaleout.config import LaunchConfig
from model.scaleout.megatron_bridge import (
    MegatronPlan,
    MLflowTarget,
    export_argv,
    import_argv,
    imported_checkpoint,
    plan_long_context,
    plan_megatron,
)


def indexed_datasets(prepared_root: str) -> tuple[dict[str, Path], str, int]:
    """Every source's training shard as a Megatron indexed dataset (written once per prepared data):
    (source -> path prefix, the tokenizer directory, its vocabulary size)."""
    root = Path(prepared_root)
    prepared = PreparedData.load(root)
    shards = {name: TokenShard.open(src.train) for name, src in prepared.sources.items()}
    prefixes = write_indexed_dir(shards, root.parent / f"{root.name}-megatron")
    return prefixes, str(prepared.tokenizer_dir), prepared.vocab_size


def hf_template(model: ModelConfig, vocab_size: int, tokenizer_dir: str, out: Path) -> Path:
    """A directory with the preset's HF config and the tokenizer: what the HF bridge exports against
    when pretraining starts from a preset (there is no input checkpoint to take them from)."""
    from model.build import build_hf_config
    from model.checkpoint import _copy_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    build_hf_config(model, vocab_size).save_pretrained(out)
    _copy_tokenizer(Path(tokenizer_dir), out)
    return out


def _phase_plans(base: MegatronPlan, ends: list[tuple[str, int]], blends: dict[str, dict[str, float]],
                 prefixes: dict[str, Path]) -> list[tuple[str, MegatronPlan]]:
    plans = []
    for name, end in ends:
        paths = [str(prefixes[s]) for s, w in blends[name].items() if w > 0]
        weights = [float(w) for w in blends[name].values() if w > 0]
        o = {**base.overrides, "train.train_iters": end, "dataset.blend": [paths, weights]}
        plans.append((name, dataclasses.replace(base, overrides=o, train_iters=end)))
    return plans


def pretrain_plan(train: TrainConfig, phases, model: ModelConfig, launch: LaunchConfig, prepared_root: str,
                  out_dir: Path, seed: int, mlflow: MLflowTarget) -> EnginePlan:
    """The launches of a pretraining stage on Megatron-Bridge (one per phase), and its export."""
    prefixes, tokenizer, vocab_size = indexed_datasets(prepared_root)
    first = phases[0].blend
    base = plan_megatron(train, launch, model, stage_mode="pretrain", save_dir=out_dir / "megatron",
                         seed=seed, mlflow=mlflow, tokenizer=tokenizer, vocab_size=vocab_size,
                         blend=[(str(prefixes[s]), w) for s, w in first.items() if w > 0],
                         field="stages.pretrain")
    per_step = train.tokens_per_step
    ends = [(p.name, min(base.train_iters, round(p.until * train.tokens) // per_step)) for p in phases]
    plans = _phase_plans(base, [(n, e) for n, e in ends if e > 0], {p.name: p.blend for p in phases}, prefixes)
    steps = [EngineStep(f"megatron-train-{name}", plan.argv(), style="torchrun") for name, plan in plans]
    template = hf_template(model, vocab_size, tokenizer, out_dir / "hf-template")
    last = plans[-1][1]
    export = out_dir / "megatron-export"
    steps.append(EngineStep("megatron-export", export_argv(last, template, export), one_node=True))
    return EnginePlan(steps=steps, export_dir=export, step=last.train_iters, tokens=last.train_iters * per_step)


def long_context_plan(stage, model: ModelConfig, launch: LaunchConfig, start: str, out_dir: Path, seed: int,
                      mlflow: MLflowTarget, blend: list[tuple[str, float]]) -> EnginePlan:
    """Import the input checkpoint, train at the block's one length, export."""
    megatron_in = out_dir / "megatron-import"
    plan = plan_long_context(stage, launch, model, save_dir=out_dir / "megatron",
                             pretrained_checkpoint=imported_checkpoint(megatron_in), seed=seed, mlflow=mlflow,
                             tokenizer=start, blend=blend)
    export = out_dir / "megatron-export"
    steps = [EngineStep("megatron-import", import_argv(start, megatron_in), one_node=True),
             EngineStep("megatron-train", plan.argv(), style="torchrun"),
             EngineStep("megatron-export", export_argv(plan, start, export), one_node=True)]
    per_step = plan.overrides["train.global_batch_size"] * plan.overrides["dataset.seq_length"]
    return EnginePlan(steps=steps, export_dir=export, step=plan.train_iters, tokens=plan.train_iters * per_step)
