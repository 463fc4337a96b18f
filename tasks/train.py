"""Prefect task: train one stretch of a stage (a phase, or a gate's chunk) to a token mark.

A stretch is a `fit(until_tokens)` of the stage's one Trainer schedule, resumed from the
previous stretch's checkpoint: the LR schedule, data position and RNG carry over exactly,
so a stage split into tasks trains the same weights as one uninterrupted run. What a stretch
trains (TrainSpec) and how its Trainer is built are the model library's (model/train_spec.py).
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from stagewise.model.checkpoint import read_meta
from stagewise.model.train_spec import TrainSpec, build_trainer
from stagewise.refs import CheckpointRef
from stagewise.store.policy import once
from stagewise.store.tracking import Tracker


@task(**once("train"))
def train_task(
    spec: TrainSpec,
    label: str,
    until_tokens: int,
    resume_from: str | None = None,
    tracker: Tracker | None = None,
    run_id: str | None = None,
    past_budget: bool = False,
) -> CheckpointRef:
    """Train `spec.stage` from `resume_from` (or its start) until `until_tokens` (with `past_budget`,
    beyond the stage's budget: a gate's reviewer extended it); save; return the checkpoint."""
    logger = get_run_logger()
    log = (lambda records: tracker.log_metrics(run_id, records)) if tracker and run_id else None
    trainer, batches = build_trainer(spec, log=log, on_warning=logger.warning)
    with trainer:
        if resume_from:
            trainer.resume(Path(resume_from))
        logger.info("%s %s: training to %d tokens", spec.stage, label, until_tokens)
        result = trainer.fit(until_tokens, past_budget)
    if tracker and run_id and hasattr(batches, "realized"):
        realized = {}
        for key, value in batches.realized().items():  # per phase per source, or per source
            per = value if isinstance(value, dict) else {key: value}
            prefix = key if isinstance(value, dict) else spec.stage
            realized |= {f"data/{prefix}/{src}_tokens": n for src, n in per.items()}
        tracker.log_metrics(run_id, [(result.step, result.tokens_seen, realized)])
    if result.stop_reason == "data_exhausted":
        logger.warning("%s: the data ran out at %d tokens (every source hit its epoch cap)", spec.stage, result.tokens_seen)
    meta = read_meta(result.checkpoint)
    return CheckpointRef(path=str(result.checkpoint), step=result.step, tokens_seen=result.tokens_seen,
                         sha256=meta.weight_sha256 or "")
