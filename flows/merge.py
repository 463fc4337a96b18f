"""The merge stage: merge pretraining checkpoints over windows, keep the best (WSM).

At every saved pretraining checkpoint, each configured window (in tokens) that fits is
merged with coefficients emulating an LR decay (ALGORITHMS.md section 2) and scored on the
held-out data next to the trained checkpoint (`merge/<window>/loss`, `merge/trained/loss`,
logged at that checkpoint's step and tokens). The best merge over the whole run is kept;
the stage hands on that merge if it beats the last trained checkpoint by more than
`min_improvement`, else the trained checkpoint. A plot of trained vs merged over tokens
is the stage's report. A rerun over the same checkpoints and settings reuses the recorded
decision (`decision.json`, tagged `stagewise.reused`) instead of merging every window again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from prefect import flow, get_run_logger

from flows.stage_schemas import MergeStage
from tasks.merge import merge_at_checkpoint_task
from tasks.refs import PreparedRef, StageResult
from tasks.tracking import STAGE_TAG, Tracker

STAGE = "merge"


DECISION = "decision.json"


def _record(out_root: Path, handed: str, metrics: dict[str, float], choice: str) -> None:
    """Write the stage's decision last and atomically: its presence means the sweep finished."""
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = out_root / f".{DECISION}.tmp"
    tmp.write_text(json.dumps({"handed": handed, "metrics": metrics, "choice": choice}, indent=2))
    tmp.replace(out_root / DECISION)


def _reuse(out_root: Path) -> tuple[str, dict[str, float], str] | None:
    """(handed on, metrics, choice) of a finished sweep over the same checkpoints and settings
    (out_root is named by their hash), when the checkpoint it hands on still exists."""
    path = out_root / DECISION
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    return (saved["handed"], saved["metrics"], saved["choice"]) if Path(saved["handed"]).exists() else None


def _report(tracker: Tracker, run_id: str, windows: list[int]) -> None:
    from eval.plots import merge_curves

    histories = tracker.metric_histories(run_id, ["merge/trained/loss"] + [f"merge/{w}/loss" for w in windows])
    tracker.log_figure(run_id, merge_curves(histories), "reports/merge_vs_trained.png")


@flow(name="merge", log_prints=True)
def merge_flow(
    stage: MergeStage,
    pretrain: StageResult,
    seq_length: int,
    workdir: str,
    seed: int,
    recipe_hash: str,
    tracker: Tracker,
    parent_run_id: str | None = None,
    suites: dict[str, list[str]] | None = None,
) -> StageResult:
    """Merge the checkpoints of `pretrain.stage_dir` over `stage.windows_tokens` and hand on the best."""
    from model.merge import checkpoints_with_tokens

    logger = get_run_logger()
    if not pretrain.stage_dir or not pretrain.data_root:
        raise ValueError("the merge stage needs a pretraining stage in the same run (its checkpoints and data)")
    with tracker.run(STAGE, {STAGE_TAG: STAGE}, parent_run_id) as run_id:
        ckpts = [(str(p), t) for p, t in checkpoints_with_tokens(pretrain.stage_dir)]
        key = json.dumps([stage.model_dump(), [Path(p).name for p, _ in ckpts], pretrain.checkpoint], sort_keys=True)
        out_root = Path(workdir) / "stages" / f"{STAGE}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        reused = _reuse(out_root)
        if reused is not None:
            handed, metrics, choice = reused
            logger.info("merge already decided for these checkpoints: reusing %s (%s)", handed, choice)
            tracker.set_tags(run_id, {"stagewise.reused": "true", "stagewise.merge_choice": choice})
            tracker.log_metrics(run_id, [(0, 0, {f"merge/{k}": v for k, v in metrics.items()})])
            tracker.register_checkpoint(tracker.experiment, Path(handed), run_id, alias=STAGE)
            return StageResult(stage=STAGE, checkpoint=handed, run_id=run_id, metrics=metrics,
                               data_root=pretrain.data_root, stage_dir=str(out_root))
        candidates = out_root / "candidates"
        prepared = PreparedRef(root=pretrain.data_root, digest=Path(pretrain.data_root).name)
        best: tuple[float, str, int] | None = None
        trained_loss = None
        for path, tokens in ckpts:
            scores = merge_at_checkpoint_task(ckpts, path, stage.windows_tokens, stage.schedule, stage.ordering, seed,
                                              str(candidates), prepared, seq_length, stage.val_tokens, recipe_hash,
                                              tracker, run_id, (suites or {}).get(stage.eval_suite or ""),
                                              stage.eval_limit)
            trained_loss = scores["trained"]
            for w, (loss, merged) in scores["merges"].items():
                if best is None or loss < best[0]:
                    if best is not None:
                        shutil.rmtree(best[1], ignore_errors=True)
                    best = (loss, merged, w)
                else:
                    shutil.rmtree(merged, ignore_errors=True)
        handed, metrics = pretrain.checkpoint, {"trained_loss": trained_loss or float("nan")}
        if best is not None:
            metrics |= {"best_merge_loss": best[0], "best_window_tokens": float(best[2])}
            if trained_loss is not None and best[0] < trained_loss - stage.min_improvement:
                final = out_root / "best"
                if final.exists():
                    shutil.rmtree(final)
                Path(best[1]).rename(final)
                handed = str(final)
        logger.info("merge hands on %s (%s)", handed, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        tracker.log_metrics(run_id, [(0, 0, {f"merge/{k}": v for k, v in metrics.items()})])
        choice = "merge" if handed != pretrain.checkpoint else "trained"
        tracker.set_tags(run_id, {"stagewise.merge_choice": choice})
        _record(out_root, handed, metrics, choice)
        _report(tracker, run_id, stage.windows_tokens)
        tracker.register_checkpoint(tracker.experiment, Path(handed), run_id, alias=STAGE)
    return StageResult(stage=STAGE, checkpoint=handed, run_id=run_id, metrics=metrics,
                       data_root=pretrain.data_root, stage_dir=str(out_root))
