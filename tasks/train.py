"""Prefect task: train one stretch of a stage (a phase, or a gate's chunk) to a token mark.

A stretch is a `fit(until_tokens)` of the stage's one Trainer schedule, resumed from the
previous stretch's checkpoint: the LR schedule, data position and RNG carry over exactly,
so a stage split into tasks trains the same weights as one uninterrupted run. The data a
stage reads is one of a few kinds (token shards with a phase blend, or packed
conversations); the objective goes with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from prefect import get_run_logger, task
from pydantic import BaseModel, Field

from stagewise.data.config import PhaseConfig
from stagewise.data.long_context_config import LongContextDataConfig
from stagewise.model.config import LoRAConfig, ModelConfig, TrainConfig
from stagewise.store.refs import CheckpointRef, PreparedRef
from stagewise.store.tracking import Tracker
from stagewise.tasks.policy import once


class ShardData(BaseModel):
    """Pretraining data: prepared token shards read through a phase blend."""

    kind: Literal["shards"] = "shards"
    prepared: PreparedRef
    phases: list[PhaseConfig]
    max_epochs: dict[str, float]


class PackedData(BaseModel):
    """SFT data: conversations rendered and packed into rows (an .npz of data/sft_data.py)."""

    kind: Literal["packed"] = "packed"
    rows: str
    tokenizer_dir: str
    max_epochs: float | None = None


class LongContextData(BaseModel):
    """Long-context data: token shards per source, a length mix and a token blend."""

    kind: Literal["long_context"] = "long_context"
    shards: dict[str, str]
    config: LongContextDataConfig
    blend: dict[str, float]
    tokenizer_dir: str


class TrainSpec(BaseModel):
    """Everything a training task needs, and nothing else of the recipe."""

    stage: str
    model: ModelConfig
    train: TrainConfig
    data: Annotated[Union[ShardData, PackedData, LongContextData], Field(discriminator="kind")]
    objective: Literal["lm", "sft_token", "sft_conversation"] = "lm"
    out_dir: str
    seed: int
    recipe_hash: str
    parent: str | None = None
    """The checkpoint this stage starts from (recorded as the first checkpoint's parent)."""
    device: str = "cpu"
    lora: LoRAConfig | None = None
    """Train LoRA adapters on the model (model/lora.py); every checkpoint is saved merged."""


def tokenizer_dir(spec: TrainSpec) -> Path:
    """Where the stage's tokenizer lives (copied into every checkpoint)."""
    if isinstance(spec.data, ShardData):
        from stagewise.data.prepare import PreparedData

        return Path(PreparedData.load(Path(spec.data.prepared.root)).tokenizer_dir)
    return Path(spec.data.tokenizer_dir)


def _batches(spec: TrainSpec, on_warning):
    if isinstance(spec.data, ShardData):
        from stagewise.data.loader import PretrainBatches
        from stagewise.data.prepare import PreparedData

        prepared = PreparedData.load(Path(spec.data.prepared.root))
        t = spec.train
        return PretrainBatches(prepared, spec.data.phases, spec.data.max_epochs, t.seq_length, t.global_batch,
                               t.tokens, spec.seed, on_warning=on_warning)
    if isinstance(spec.data, LongContextData):
        from stagewise.data.long_context import LongContextBatches
        from stagewise.data.shards import TokenShard

        shards = {name: TokenShard.open(Path(path)) for name, path in spec.data.shards.items()}
        return LongContextBatches(shards, spec.data.config, spec.data.blend, spec.seed)
    from stagewise.data.sft_data import PackedBatches, load_packed

    return PackedBatches(load_packed(spec.data.rows), spec.train.global_batch, seed=spec.seed,
                         max_epochs=spec.data.max_epochs)


def _objective(spec: TrainSpec):
    if spec.objective == "lm":
        from stagewise.model.objectives.lm import LMObjective

        return LMObjective(spec.train.lb_loss_coeff)
    from stagewise.model.objectives.sft import SFTObjective

    return SFTObjective(spec.objective.removeprefix("sft_"), spec.train.lb_loss_coeff)


def build_trainer(spec: TrainSpec, log=None, on_warning=None, progress: bool = True):
    """The stage's Trainer and its batch source, fresh (call `.resume(ckpt)` to continue)."""
    from stagewise.model.build import build_model
    from stagewise.model.engine import Trainer
    from transformers import AutoTokenizer

    tok_dir = tokenizer_dir(spec)
    vocab = len(AutoTokenizer.from_pretrained(str(tok_dir)))
    model = build_model(spec.model, vocab_size=vocab, seed=spec.seed, device=spec.device)
    batches = _batches(spec, on_warning)
    trainer_class = Trainer
    if spec.lora is not None:
        from stagewise.model.lora import apply_lora, lora_trainer_class

        model = apply_lora(model, spec.lora.r, spec.lora.alpha, spec.lora.target_modules, spec.lora.dropout,
                           seed=spec.seed)
        trainer_class = lora_trainer_class()
    trainer = trainer_class(
        model, spec.train, batches, _objective(spec), out_dir=Path(spec.out_dir), stage=spec.stage,
        tokenizer_dir=tok_dir, recipe_hash=spec.recipe_hash, log=log, device=spec.device,
        progress=progress, parent=spec.parent,
    )
    return trainer, batches


@task(**once("train"))
def train_task(
    spec: TrainSpec,
    label: str,
    until_tokens: int,
    resume_from: str | None = None,
    tracker: Tracker | None = None,
    run_id: str | None = None,
) -> CheckpointRef:
    """Train `spec.stage` from `resume_from` (or its start) until `until_tokens`; save; return the checkpoint."""
    logger = get_run_logger()
    log = (lambda records: tracker.log_metrics(run_id, records)) if tracker and run_id else None
    trainer, batches = build_trainer(spec, log=log, on_warning=logger.warning)
    with trainer:
        if resume_from:
            trainer.resume(Path(resume_from))
        logger.info("%s %s: training to %d tokens", spec.stage, label, until_tokens)
        result = trainer.fit(until_tokens)
    if tracker and run_id and hasattr(batches, "realized"):
        realized = {}
        for key, value in batches.realized().items():  # per phase per source, or per source
            per = value if isinstance(value, dict) else {key: value}
            prefix = key if isinstance(value, dict) else spec.stage
            realized |= {f"data/{prefix}/{src}_tokens": n for src, n in per.items()}
        tracker.log_metrics(run_id, [(result.step, result.tokens_seen, realized)])
    if result.stop_reason == "data_exhausted":
        logger.warning("%s: the data ran out at %d tokens (every source hit its epoch cap)", spec.stage, result.tokens_seen)
    from stagewise.model.checkpoint import read_meta

    meta = read_meta(result.checkpoint)
    return CheckpointRef(path=str(result.checkpoint), step=result.step, tokens_seen=result.tokens_seen,
                         sha256=meta.weight_sha256 or "")
