"""Prefect task: at one pretraining checkpoint, merge every window that fits and score it."""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import task

from stagewise.model.checkpoint import read_meta
from stagewise.model.merge import merge_checkpoints, merge_coefficients, select_window
from stagewise.refs import CheckpointRef, PreparedRef
from stagewise.store.policy import retrying, run_logger
from stagewise.store.tracking import Tracker
from stagewise.tasks.evaluate import suite_task, validation_task


def _ref(path: Path) -> CheckpointRef:
    meta = read_meta(path)
    return CheckpointRef(path=str(path), step=meta.step, tokens_seen=meta.tokens_seen, sha256=meta.weight_sha256 or "")


@task(**retrying("merge-at-checkpoint"))
def merge_at_checkpoint_task(
    checkpoints: list[tuple[str, int]],
    end: str,
    windows_tokens: list[int],
    schedule: str,
    ordering: str,
    seed: int,
    out_root: str,
    prepared: PreparedRef,
    seq_length: int,
    val_tokens: int,
    recipe_hash: str,
    tracker: Tracker,
    run_id: str,
    suite: list[str] | None = None,
    suite_limit: int | None = None,
    device: str = "cpu",
) -> dict:
    """Score the trained checkpoint `end` and the merge of each window ending there.

    Every checkpoint is scored by validation_task and, with `suite`, suite_task (the scorers
    of every stage), logged as `merge/trained/...` and `merge/<window>/...` at the step of
    `end`. Returns {"trained": loss, "merges": {window: (loss, path)}}; merged checkpoints are
    written under `out_root/<step>-w<window>` (the caller keeps only the best)."""
    logger = run_logger()
    trained = _ref(Path(end))

    def score(ref: CheckpointRef, prefix: str) -> float:
        """The same scorers as every stage (tasks/evaluate.py), under this checkpoint's prefix."""
        loss = validation_task.fn(ref, prepared, seq_length, val_tokens, tracker, run_id, prefix=prefix,
                                  device=device)["loss"]
        if suite:
            suite_task.fn(ref, suite, suite_limit, tracker, run_id, prefix=prefix, device=device)
        return loss

    out = {"trained": score(trained, "merge/trained"), "merges": {}}
    for w in windows_tokens:
        window = select_window(checkpoints, end=end, window_tokens=w)
        if not window.fits:
            logger.info("window %d at %d tokens: %s", w, trained.tokens_seen, window.reason)
            continue
        target = Path(out_root) / f"step-{trained.step:08d}-w{w}"
        if target.exists():
            shutil.rmtree(target)
        coeffs = merge_coefficients(len(window.paths), schedule, ordering, seed)
        merged = merge_checkpoints(window.paths, coeffs, target, schedule, ordering=ordering, seed=seed,
                                   window_tokens=w, recipe_hash=recipe_hash)
        ref = CheckpointRef(path=str(merged), step=trained.step, tokens_seen=trained.tokens_seen)
        loss = score(ref, f"merge/{w}")
        out["merges"][w] = (loss, str(merged))
        logger.info("window %d at %d tokens (%d checkpoints): merged %.4f vs trained %.4f",
                    w, trained.tokens_seen, len(window.paths), loss, out["trained"])
    return out
