"""Prefect task: train one stretch of a stage (e.g. one pretraining phase) to a token mark.

A phase is a `fit(until_tokens)` of the same Trainer schedule, resumed from the previous
phase's checkpoint: the LR schedule, data position and RNG carry over exactly, so phases
split by tasks train the same weights as one uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

from data.config import PhaseConfig
from model.config import ModelConfig, TrainConfig
from tasks.refs import CheckpointRef, PreparedRef
from tasks.tracking import Tracker


class TrainSpec(BaseModel):
    """Everything a training task needs, and nothing else of the recipe."""

    stage: str
    model: ModelConfig
    train: TrainConfig
    phases: list[PhaseConfig]
    max_epochs: dict[str, float]
    prepared: PreparedRef
    out_dir: str
    seed: int
    recipe_hash: str
    device: str = "cpu"


def _build_trainer(spec: TrainSpec, tracker: Tracker | None, run_id: str | None, on_warning):
    from data.loader import PretrainBatches
    from data.prepare import PreparedData
    from model.build import build_model
    from model.engine import Trainer
    from model.objectives.lm import LMObjective
    from transformers import AutoTokenizer

    prepared = PreparedData.load(Path(spec.prepared.root))
    vocab = len(AutoTokenizer.from_pretrained(str(prepared.tokenizer_dir)))
    model = build_model(spec.model, vocab_size=vocab, seed=spec.seed, device=spec.device)
    batches = PretrainBatches(
        prepared, spec.phases, spec.max_epochs, spec.train.seq_length, spec.train.global_batch,
        spec.train.tokens, spec.seed, on_warning=on_warning,
    )
    log = (lambda records: tracker.log_metrics(run_id, records)) if tracker and run_id else (lambda records: None)
    trainer = Trainer(
        model, spec.train, batches, LMObjective(spec.train.lb_loss_coeff), out_dir=Path(spec.out_dir),
        stage=spec.stage, tokenizer_dir=prepared.tokenizer_dir, recipe_hash=spec.recipe_hash,
        log=log, device=spec.device,
    )
    return trainer, batches


@task(name="train-phase", cache_policy=NO_CACHE)
def train_phase_task(
    spec: TrainSpec,
    phase: str,
    until_tokens: int,
    resume_from: str | None = None,
    tracker: Tracker | None = None,
    run_id: str | None = None,
) -> CheckpointRef:
    """Train `spec.stage` from `resume_from` (or from scratch) until `until_tokens`."""
    logger = get_run_logger()
    trainer, batches = _build_trainer(spec, tracker, run_id, on_warning=logger.warning)
    if resume_from:
        trainer.resume(Path(resume_from))
    logger.info("phase %s: training to %d tokens", phase, until_tokens)
    result = trainer.fit(until_tokens)
    if tracker and run_id:
        realized = {
            f"data/{ph}/{src}_tokens": tokens
            for ph, per_source in batches.realized().items()
            for src, tokens in per_source.items()
        }
        tracker.log_metrics(run_id, [(result.step, result.tokens_seen, realized)])
    meta_sha = _weight_sha(result.checkpoint)
    return CheckpointRef(path=str(result.checkpoint), step=result.step, tokens_seen=result.tokens_seen, sha256=meta_sha)


def _weight_sha(checkpoint: Path) -> str:
    from model.checkpoint import read_meta

    return read_meta(Path(checkpoint)).weight_sha256
