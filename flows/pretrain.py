"""The pretraining stage as a Prefect flow: prepare data -> train each phase -> validate.

Phases share one LR schedule and one data stream; each phase is a task that resumes the
previous phase's checkpoint, so the curriculum reads as a list of tasks in the Prefect UI
and a crash loses at most one checkpoint interval (`stagewise run --resume`).

The stage directory is named by a hash of everything that determines its weights (model,
training config, phases, data digest, seed): re-running an unchanged, finished stage does
no training and hands on the same checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prefect import flow, get_run_logger

from data.config import DataConfig, TokenizerConfig
from flows.recipe import PretrainStage
from model.config import ModelConfig, TrainConfig
from tasks.data import prepare_data_task
from tasks.evaluate import loss_report_task, validation_task
from tasks.refs import CheckpointRef, StageResult
from tasks.tracking import STAGE_TAG, Tracker
from tasks.train import TrainSpec, train_phase_task

STAGE = "pretrain"


class StageStateError(RuntimeError):
    """A stage directory holds an interrupted run and --resume was not given."""


def _stage_dir(workdir: Path, spec_fields: dict) -> Path:
    digest = hashlib.sha256(json.dumps(spec_fields, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return workdir / "stages" / f"{STAGE}-{digest}"


def _existing(out_dir: Path, total_tokens: int, resume: bool) -> CheckpointRef | None:
    """The checkpoint to continue from: the finished one, or (with --resume) the latest."""
    from model.checkpoint import latest_checkpoint, read_meta

    latest = latest_checkpoint(out_dir)
    if latest is None:
        return None
    meta = read_meta(latest)
    ref = CheckpointRef(path=str(latest), step=meta.step, tokens_seen=meta.tokens_seen, sha256=meta.weight_sha256)
    if meta.tokens_seen >= total_tokens or resume:
        return ref
    raise StageStateError(
        f"{out_dir} holds an interrupted run (last checkpoint at {meta.tokens_seen:,} tokens); "
        "pass --resume to continue it, or delete the directory to start over"
    )


@flow(name="pretrain", log_prints=True)
def pretrain_flow(
    model: ModelConfig,
    data: DataConfig,
    tokenizer: TokenizerConfig,
    stage: PretrainStage,
    workdir: str,
    base_dir: str,
    seed: int,
    recipe_hash: str,
    tracker: Tracker,
    parent_run_id: str | None = None,
    resume: bool = False,
    device: str = "cpu",
) -> StageResult:
    """Phased pretraining of `stage` (a `stages.pretrain` block) on the recipe's data."""
    logger = get_run_logger()
    pretrain = stage
    run_id = tracker.start_run(STAGE, {STAGE_TAG: STAGE}, parent_run_id)
    try:
        prepared = prepare_data_task(data, tokenizer, workdir, seed, base_dir, tracker, run_id)
        train_cfg = TrainConfig.model_validate(pretrain.model_dump(exclude={"phases", "val_tokens"}))
        out_dir = _stage_dir(Path(workdir), {
            "model": model.model_dump(), "train": train_cfg.model_dump(), "phases": [p.model_dump() for p in pretrain.phases],
            "data": prepared.digest, "seed": seed,
        })
        tracker.set_tags(run_id, {"stagewise.stage_dir": str(out_dir)})
        spec = TrainSpec(
            stage=STAGE, model=model, train=train_cfg, phases=pretrain.phases,
            max_epochs={s.name: s.max_epochs for s in data.sources}, prepared=prepared,
            out_dir=str(out_dir), seed=seed, recipe_hash=recipe_hash, device=device,
        )
        total = train_cfg.total_steps * train_cfg.tokens_per_step
        ckpt = _existing(out_dir, total, resume)
        if ckpt is not None and ckpt.tokens_seen >= total:
            logger.info("pretrain already finished at %s: reusing it", ckpt.path)
            tracker.set_tags(run_id, {"stagewise.reused": "true"})
        metrics: dict[str, float] = {}
        for phase in pretrain.phases:
            until = min(round(phase.until * train_cfg.tokens), total)
            if ckpt is not None and ckpt.tokens_seen >= until:
                continue
            ckpt = train_phase_task(spec, phase.name, until, ckpt.path if ckpt else None, tracker, run_id)
            metrics = validation_task(ckpt, prepared, train_cfg.seq_length, pretrain.val_tokens, tracker, run_id)
        if not metrics:
            metrics = validation_task(ckpt, prepared, train_cfg.seq_length, pretrain.val_tokens, tracker, run_id)
        loss_report_task(tracker, run_id, STAGE)
        tracker.register_checkpoint(tracker.experiment, Path(ckpt.path), run_id, alias=STAGE)
        tracker.end_run(run_id)
    except BaseException:
        tracker.end_run(run_id, "FAILED")
        raise
    headline = {f"validation_{k}": v for k, v in metrics.items() if k in ("loss", "unigram_baseline")}
    return StageResult(stage=STAGE, checkpoint=ckpt.path, run_id=run_id, metrics=headline)
