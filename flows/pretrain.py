"""The pretraining stage as a Prefect flow: prepare data -> train in stretches -> validate.

Phases share one LR schedule and one data stream; each stretch (a phase, or a gate's
chunk of `eval_every_tokens`) is a task that resumes the previous one's checkpoint, so
the curriculum reads as a list of tasks in the Prefect UI and a crash loses at most one
checkpoint interval (`stagewise run --resume`).

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
from flows.stage_loop import run_stretches
from model.config import ModelConfig, TrainConfig
from tasks.data import prepare_data_task
from tasks.evaluate import loss_report_task, suite_task, validation_task
from tasks.refs import CheckpointRef, PreparedRef, StageResult
from tasks.tracking import STAGE_TAG, Tracker
from tasks.train import ShardData, TrainSpec

STAGE = "pretrain"


class StageStateError(RuntimeError):
    """A stage directory holds an interrupted run and --resume was not given."""


def stage_dir(workdir: Path, stage: str, spec_fields: dict) -> Path:
    """`<workdir>/stages/<stage>-<hash of what determines the weights>`."""
    digest = hashlib.sha256(json.dumps(spec_fields, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return workdir / "stages" / f"{stage}-{digest}"


def existing_checkpoint(out_dir: Path, total_tokens: int, resume: bool) -> CheckpointRef | None:
    """The checkpoint to continue from: the finished one, or (with --resume) the latest."""
    from model.checkpoint import latest_checkpoint, read_meta

    latest = latest_checkpoint(out_dir)
    if latest is None:
        return None
    meta = read_meta(latest)
    ref = CheckpointRef(path=str(latest), step=meta.step, tokens_seen=meta.tokens_seen, sha256=meta.weight_sha256 or "")
    if meta.tokens_seen >= total_tokens or resume:
        return ref
    raise StageStateError(
        f"{out_dir} holds an interrupted run (last checkpoint at {meta.tokens_seen:,} tokens); "
        "pass --resume to continue it, or delete the directory to start over"
    )


def evaluator(prepared: PreparedRef, seq_length: int, val_tokens: int, suite: list[str] | None,
              limit: int | None, tracker: Tracker, run_id: str):
    """What a pretraining checkpoint is scored on at every mark: validation loss (+ a suite)."""
    def evaluate(ckpt: CheckpointRef) -> dict:
        metrics = validation_task(ckpt, prepared, seq_length, val_tokens, tracker, run_id)
        if suite:
            metrics |= suite_task(ckpt, suite, limit, tracker, run_id)
        return metrics
    return evaluate


@flow(name="pretrain", log_prints=True)
def pretrain_flow(
    model: ModelConfig,
    data: DataConfig,
    tokenizer: TokenizerConfig,
    stage: PretrainStage,
    suites: dict[str, list[str]],
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
    with tracker.run(STAGE, {STAGE_TAG: STAGE}, parent_run_id) as run_id:
        prepared = prepare_data_task(data, tokenizer, workdir, seed, base_dir, tracker, run_id)
        train_cfg = TrainConfig.model_validate(stage.model_dump(include=set(TrainConfig.model_fields)))
        out_dir = stage_dir(Path(workdir), STAGE, {
            "model": model.model_dump(), "train": train_cfg.model_dump(), "phases": [p.model_dump() for p in stage.phases],
            "data": prepared.digest, "seed": seed,
        })
        spec = TrainSpec(
            stage=STAGE, model=model, train=train_cfg, out_dir=str(out_dir), seed=seed, recipe_hash=recipe_hash,
            device=device, data=ShardData(prepared=prepared, phases=stage.phases,
                                          max_epochs={s.name: s.max_epochs for s in data.sources}),
        )
        total = train_cfg.total_steps * train_cfg.tokens_per_step
        start = existing_checkpoint(out_dir, total, resume)
        if start is not None and start.tokens_seen >= total:
            logger.info("pretrain already finished at %s: reusing it", start.path)
            tracker.set_tags(run_id, {"stagewise.reused": "true"})
        gate = stage.gate
        suite_name = gate.suite if gate else stage.eval_suite
        evaluate = evaluator(prepared, train_cfg.seq_length, stage.val_tokens, suites.get(suite_name) if suite_name else None,
                             gate.eval_limit if gate else None, tracker, run_id)
        phase_ends = [(p.name, round(p.until * train_cfg.tokens)) for p in stage.phases]
        ckpt, decision = run_stretches(spec, phase_ends, total, start, evaluate, tracker, run_id, gate)
        metrics = validation_task(ckpt, prepared, train_cfg.seq_length, stage.val_tokens, tracker, run_id)
        loss_report_task(tracker, run_id, STAGE)
        tracker.register_checkpoint(tracker.experiment, Path(ckpt.path), run_id, alias=STAGE)
    headline = {f"validation_{k}": v for k, v in metrics.items() if k in ("loss", "unigram_baseline")}
    return StageResult(stage=STAGE, checkpoint=ckpt.path, run_id=run_id, gate=decision, metrics=headline,
                       data_root=prepared.root, stage_dir=str(out_dir))
