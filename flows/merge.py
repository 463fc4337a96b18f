"""The merge stage: merge pretraining checkpoints over windows, keep the best (WSM).

At every saved pretraining checkpoint, each configured window (in tokens) that fits is
merged with coefficients emulating an LR decay (ALGORITHMS.md section 2) and scored on the
held-out data next to the trained checkpoint (`merge/<window>/loss`, `merge/trained/loss`,
logged at that checkpoint's step and tokens). The best merge over the whole run is kept;
the stage hands on that merge if it beats the last trained checkpoint by more than
`min_improvement`, else the trained checkpoint. A plot of trained vs merged over tokens
is the stage's report. The sweep is a content-addressed step over the pretraining
checkpoints' weights and the merge settings: a rerun reuses its recorded decision.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect import flow, get_run_logger
from pydantic import BaseModel

from stagewise.eval.plots import merge_curves
from stagewise.flows.stage import Stage, StageContext, Upstream, checkpoint_hash, finish, reused_result, stage_run
from stagewise.model.merge import checkpoints_with_tokens
from stagewise.recipe import Recipe
from stagewise.recipe.blocks.merge import MergeStage
from stagewise.refs import PreparedRef, StageResult, StageSummary
from stagewise.store.steps import step_dir
from stagewise.store.tracking import Tracker
from stagewise.tasks.merge import merge_at_checkpoint_task

STAGE = "merge"
TARGET = "merge/handed_on_loss"
CHOICE_TAG = "stagewise.merge_choice"


class MergeInputs(BaseModel):
    """What merging reads from the recipe: its block, pretraining's sequence length, the eval suites."""

    stage: MergeStage
    seq_length: int
    suites: dict[str, list[str]] = {}


def select(recipe: Recipe) -> MergeInputs | None:
    if recipe.stages.merge is None:
        return None
    seq = recipe.stages.pretrain.seq_length if recipe.stages.pretrain else 0
    return MergeInputs(stage=recipe.stages.merge, seq_length=seq, suites=recipe.eval)


def merge_spec(block: MergeInputs, seed: int) -> dict:
    """What determines the decision (hashed with the pretraining checkpoints' weights): the whole
    block (windows, schedule, scoring, min_improvement), the scoring length, the suite's tasks."""
    return {"stage": block.stage.model_dump(mode="json", exclude={"launch"}), "seq_length": block.seq_length, "seed": seed,
            "suite": block.suites.get(block.stage.eval_suite or "")}


def _report(tracker: Tracker, run_id: str, windows: list[int]) -> None:
    histories = tracker.metric_histories(run_id, ["merge/trained/loss"] + [f"merge/{w}/loss" for w in windows])
    tracker.log_figure(run_id, merge_curves(histories), "reports/merge_vs_trained.png")


@flow(name="merge")
def merge_flow(ctx: StageContext, block: MergeInputs, upstream: Upstream) -> StageResult:
    """Merge the checkpoints of pretraining's stage dir over `windows_tokens` and hand on the best."""
    logger = get_run_logger()
    stage, tracker = block.stage, ctx.tracker
    pretrain = upstream.of("pretrain")
    if pretrain is None or not pretrain.stage_dir or not pretrain.data_root:
        raise ValueError("the merge stage needs a pretraining stage in the same run (its checkpoints and data)")
    with stage_run(ctx, STAGE) as run_id:
        ckpts = [(str(p), t) for p, t in checkpoints_with_tokens(pretrain.stage_dir) if t > 0]  # not the untrained start
        inputs = [checkpoint_hash(p) for p, _ in ckpts] + [checkpoint_hash(pretrain.checkpoint)]
        out_root = step_dir(ctx.stages_root, STAGE, merge_spec(block, ctx.seed), inputs)
        reused = reused_result(ctx, STAGE, run_id, out_root)
        if reused is not None:
            logger.info("merge already decided for these checkpoints: reusing %s", reused.checkpoint)
            tracker.set_tags(run_id, {CHOICE_TAG: "merge" if reused.checkpoint != pretrain.checkpoint else "trained"})
            return reused
        candidates = out_root / "candidates"
        prepared = PreparedRef(root=pretrain.data_root, digest=Path(pretrain.data_root).name)
        best: tuple[float, str, int] | None = None
        trained_loss = None
        for path, tokens in ckpts:
            scores = merge_at_checkpoint_task(ckpts, path, stage.windows_tokens, stage.schedule, stage.ordering, ctx.seed,
                                              str(candidates), prepared, block.seq_length, stage.val_tokens,
                                              ctx.recipe_hash, tracker, run_id, block.suites.get(stage.eval_suite or ""),
                                              stage.eval_limit, ctx.runtime.device)
            trained_loss = scores["trained"]
            for w, (loss, merged) in scores["merges"].items():
                if best is None or loss < best[0]:
                    if best is not None:
                        shutil.rmtree(best[1], ignore_errors=True)
                    best = (loss, merged, w)
                else:
                    shutil.rmtree(merged, ignore_errors=True)
        handed, metrics = pretrain.checkpoint, {"trained_loss": trained_loss or float("nan")}
        handed_loss = metrics["trained_loss"]
        if best is not None:
            metrics |= {"best_merge_loss": best[0], "best_window_tokens": float(best[2])}
            if trained_loss is not None and best[0] < trained_loss - stage.min_improvement:
                final = out_root / "best"
                if final.exists():
                    shutil.rmtree(final)
                Path(best[1]).rename(final)
                handed, handed_loss = str(final), best[0]
        metrics["handed_on_loss"] = handed_loss
        logger.info("merge hands on %s (%s)", handed, ", ".join(f"{k}={v:.4f}" for k, v in metrics.items()))
        logged = {f"merge/{k}": v for k, v in metrics.items()}
        tracker.log_metrics(run_id, [(0, 0, logged)])
        tracker.set_tags(run_id, {CHOICE_TAG: "merge" if handed != pretrain.checkpoint else "trained"})
        _report(tracker, run_id, stage.windows_tokens)
        summary = StageSummary(metric=TARGET, before=trained_loss, after=handed_loss)
        result = StageResult(stage=STAGE, parent=pretrain.checkpoint, checkpoint=handed, run_id=run_id, metrics=metrics,
                             data_root=pretrain.data_root, stage_dir=str(out_root), summary=summary)
        return finish(ctx, out_root, result, logged)


STAGE_ENTRY = Stage(name=STAGE, flow=merge_flow, select=select, needs=("pretrain",))
