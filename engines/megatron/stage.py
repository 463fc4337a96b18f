"""`engine: megatron`: what pretraining, long context and SFT hand Megatron-Bridge, and what they get back.

Pretraining: the prepared shards are written once more as Megatron indexed datasets
(engines/megatron/indexed_data.py, beside the prepared data as `<workdir>/data/<digest>-megatron/`), and
each phase is one training launch with that phase's blend (`dataset.blend`), all under one
schedule: a launch trains until its phase's end step (`train.train_iters`) and the next one
resumes from its save (`checkpoint.load` = `checkpoint.save`), so the LR schedule, the optimizer
and the step count run on across the switch as in our engine. Megatron restarts its data stream
at the switch (our engine keeps its cursor); the blend changes either way.

Long context: the input checkpoint imported through the HF bridge, then one launch at the
block's single length on the blend our long-context loader samples (data.long_context_blend:
document QA, retrieval, the downscaled phase-2 sources), each source an indexed dataset: the
prepared sources' train shards (the same `<digest>-megatron/` pretraining writes) and the
document-QA train shard (`<doc_qa dir>-megatron/`). Megatron's GPTDataset cuts one concatenated
stream per source into seq_length samples and blends samples by weight; at one length a sample
share is a token share, as in our loader, but a sample may start mid-document (ours fills rows
with whole documents, best fit).

SFT: per sub-stage, the conversations our packer kept as chat rows (engines/megatron/chat_rows.py, under
the sub-stage's step directory as `megatron-data/training.jsonl`), then import -> one launch with
`--dataset local-jsonl` read through Megatron-Bridge's chat preprocessing
(megatron_bridge.chat_jsonl_overrides) -> export. A sub-stage starts from the HF checkpoint the
previous one handed on (imported again), not from its Megatron save: each sub-stage is then a step
of its own keyed on its start weights as on our engine, a LoRA sub-stage hands on merged weights
to the next, and every sub-stage's checkpoint is scored by the stage's evaluation.

Every run's last save is exported through the HF bridge against a template directory (the input
checkpoint, or for pretraining from a preset its config and the prepared tokenizer) and adopted as
our checkpoint by engines/launch/stage.py's run_engine.

What the import and the export read is never our checkpoint directory itself but a copy whose
config.json the transformers Megatron-Bridge pins reads (engines/megatron/hf_config.py: our
transformers writes layer kinds that release refuses): `<out_dir>/megatron-hf/` beside the run,
its weights symlinks to the checkpoint's; the pretraining template is written in that form. The
same goes for the run's tokenizer, which that transformers builds from the directory named by
`tokenizer.tokenizer_model` (reading its config.json too): pretraining names the prepared tokenizer
directory (a tokenizer alone), long context and SFT `<out_dir>/megatron-tokenizer/`, their
tokenizer's files (the start checkpoint's, the SFT chat tokenizer's) without the weights, config.json
rewritten (hf_config.megatron_tokenizer_dir).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stagewise.data.long_context import DOC_QA
from stagewise.data.prepare import PreparedData
from stagewise.data.shards import TokenShard
from stagewise.engines.config import LaunchConfig
from stagewise.engines.launch.stage import EnginePlan, EngineStep
from stagewise.engines.megatron.hf_config import megatron_hf_dir, megatron_tokenizer_dir, write_pinned_config
from stagewise.engines.megatron.indexed_data import write_indexed_dir
from stagewise.engines.megatron.translate import (
    MegatronPlan,
    MLflowTarget,
    chat_jsonl_overrides,
    export_argv,
    import_argv,
    imported_checkpoint,
    plan_long_context,
    plan_megatron,
    plan_sft,
)
from stagewise.model.build import build_hf_config
from stagewise.model.checkpoint import _copy_tokenizer
from stagewise.model.config import ModelConfig, TrainConfig


def indexed_shards(shard_dirs: dict[str, str | Path], out_dir: Path) -> dict[str, Path]:
    """Token shard directories as Megatron indexed datasets in `out_dir` (written once: the caller
    names it after the shards' own content-addressed directory); name -> path prefix."""
    return write_indexed_dir({name: TokenShard.open(Path(d)) for name, d in shard_dirs.items()}, out_dir)


def beside(shard_root: str | Path) -> Path:
    """Where the indexed copy of a content-addressed data directory lives: `<dir>-megatron`."""
    root = Path(shard_root)
    return root.parent / f"{root.name}-megatron"


def indexed_datasets(prepared_root: str) -> tuple[dict[str, Path], str, int]:
    """Every source's training shard as a Megatron indexed dataset (written once per prepared data):
    (source -> path prefix, the tokenizer directory, its vocabulary size)."""
    prepared = PreparedData.load(Path(prepared_root))
    prefixes = indexed_shards({name: src.train for name, src in prepared.sources.items()}, beside(prepared_root))
    return prefixes, str(prepared.tokenizer_dir), prepared.vocab_size


def hf_template(model: ModelConfig, vocab_size: int, tokenizer_dir: str, out: Path) -> Path:
    """A directory with the preset's HF config and the tokenizer: what the HF bridge exports against
    when pretraining starts from a preset (there is no input checkpoint to take them from)."""
    out.mkdir(parents=True, exist_ok=True)
    build_hf_config(model, vocab_size).save_pretrained(out)
    write_pinned_config(out)  # read by Megatron-Bridge's transformers only
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


def _from_checkpoint(plan: MegatronPlan, start: str, megatron_in: Path, out_dir: Path, suffix: str = "") -> EnginePlan:
    """A run that starts from an HF checkpoint: import it, train, export against it as template (both
    through its copy for Megatron-Bridge's transformers, `<out_dir>/megatron-hf`)."""
    export = out_dir / "megatron-export"
    hf_in = megatron_hf_dir(start, out_dir / "megatron-hf")
    steps = [EngineStep(f"megatron-import{suffix}", import_argv(hf_in, megatron_in), one_node=True),
             EngineStep(f"megatron-train{suffix}", plan.argv(), style="torchrun"),
             EngineStep(f"megatron-export{suffix}", export_argv(plan, hf_in, export), one_node=True)]
    per_step = plan.overrides["train.global_batch_size"] * plan.overrides["dataset.seq_length"]
    return EnginePlan(steps=steps, export_dir=export, step=plan.train_iters, tokens=plan.train_iters * per_step)


def run_tokenizer(tokenizer: str | Path, out_dir: Path) -> str:
    """The run's `tokenizer.tokenizer_model`: `tokenizer` (a checkpoint of ours, or a tokenizer alone) as the
    transformers Megatron-Bridge pins reads it, `<out_dir>/megatron-tokenizer` (see the module docstring)."""
    return str(megatron_tokenizer_dir(tokenizer, out_dir / "megatron-tokenizer"))


def long_context_datasets(blend: dict[str, float], data_root: str, doc_qa_train: str) -> list[tuple[str, float]]:
    """The long-context blend over indexed datasets: the prepared sources' and document QA's train shards."""
    prefixes, _, _ = indexed_datasets(data_root)
    prefixes |= indexed_shards({DOC_QA: doc_qa_train}, beside(Path(doc_qa_train).parent))
    missing = sorted(set(blend) - set(prefixes))
    if missing:
        raise ValueError(f"long_context blend names sources with no shard: {missing}; shards: {sorted(prefixes)}")
    return [(str(prefixes[s]), w) for s, w in blend.items() if w > 0]


def long_context_plan(stage, model: ModelConfig, launch: LaunchConfig, start: str, out_dir: Path, seed: int,
                      mlflow: MLflowTarget, blend: list[tuple[str, float]]) -> EnginePlan:
    """Import the input checkpoint, train at the block's one length on `blend`, export."""
    megatron_in = out_dir / "megatron-import"
    plan = plan_long_context(stage, launch, model, save_dir=out_dir / "megatron",
                             pretrained_checkpoint=imported_checkpoint(megatron_in), seed=seed, mlflow=mlflow,
                             tokenizer=run_tokenizer(start, out_dir), blend=blend)
    return _from_checkpoint(plan, start, megatron_in, out_dir)


def sft_plan(sub, model: ModelConfig, launch: LaunchConfig, start: str, tokenizer: str, dataset_root: Path,
             out_dir: Path, seed: int, mlflow: MLflowTarget, field: str) -> EnginePlan:
    """One SFT sub-stage (`sub`: its block, precision resolved): import its start checkpoint, train
    on the chat rows in `dataset_root` with the chat `tokenizer`, export (LoRA: merged)."""
    megatron_in = out_dir / "megatron-import"
    plan = plan_sft(sub, launch, model, save_dir=out_dir / "megatron",
                    pretrained_checkpoint=imported_checkpoint(megatron_in), seed=seed, mlflow=mlflow,
                    tokenizer=run_tokenizer(tokenizer, out_dir), dataset="local-jsonl",
                    dataset_overrides=chat_jsonl_overrides(dataset_root), field=field)
    return _from_checkpoint(plan, start, megatron_in, out_dir, suffix=f"-{sub.name}")
