"""The stage contract: what every stage flow receives, returns and does at its edges.

    flow(ctx: StageContext, block: <Stage>Inputs, upstream: Upstream) -> StageResult

- `ctx` is the run's common ground: workdir, base dir (relative paths in the recipe resolve
  against it), seed, recipe hash, tracker, parent MLflow run, --resume, and the resolved
  runtime (device, precision).
- `block` is a small pydantic model holding the stage's recipe block and the few recipe-level
  settings it reads (a stage never receives the whole recipe); `Stage.select` builds it.
- `upstream` holds the results of the stages that ran before it in this pipeline run.

Every stage opens its MLflow run with `stage_run` (runtime logged as params), names its
output with a content-addressed step (store/steps.py), asks `reused_result` first (a finished
step is handed back as a Prefect Cached task run and its recorded metrics are re-logged), and
ends with `finish` (marker written last, checkpoint registered under the stage's alias). A
new stage is one module that defines its flow, its inputs and a `Stage`, plus one line in
flows/registry.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict

from stagewise.model.checkpoint import latest_checkpoint, read_meta
from stagewise.model.runtime import Runtime
from stagewise.recipe.schema import stage_blocks
from stagewise.refs import CheckpointRef, StageResult
from stagewise.store.leases import releasing_new
from stagewise.store.policy import run_logger
from stagewise.store.steps import claim_step, finished, mark_finished, reuse
from stagewise.store.tracking import STAGE_TAG, Tracker

REUSED_TAG = "stagewise.reused"
STAGE_DIR_TAG = "stagewise.stage_dir"


class StageContext(BaseModel):
    """What every stage of one pipeline run shares."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    workdir: str
    base_dir: str
    """The recipe file's directory: relative paths in the recipe resolve against it."""
    seed: int
    recipe_hash: str
    tracker: Tracker
    parent_run_id: str | None = None
    resume: bool = False
    runtime: Runtime = Runtime()
    run_tags: dict[str, str] = {}
    """Extra MLflow tags on every run this context opens (an ablation's `stagewise.variant`)."""

    @property
    def stages_root(self) -> Path:
        """Where stage steps live: `<workdir>/stages/`."""
        return Path(self.workdir) / "stages"


class Upstream(BaseModel):
    """Results of the stages that ran earlier in this pipeline run, in order."""

    results: list[StageResult] = []

    def of(self, stage: str) -> StageResult | None:
        return next((r for r in reversed(self.results) if r.stage == stage), None)

    def last(self) -> StageResult | None:
        return self.results[-1] if self.results else None

    def read_by(self, entry: "Stage", block: BaseModel | None) -> "Upstream":
        """Only the results `entry` reads: the one handed on (unless it starts from nothing and needs
        nothing), those of `entry.needs` and of `entry.reads(block)`. Prefect draws an edge in the flow-run
        graph from every earlier result a stage is given, so the graph then reads as the recipe's chain."""
        if not self.results:
            return self
        wanted = {*entry.needs, *(entry.reads(block) if entry.reads and block is not None else ())}
        last = self.results[-1] if (entry.start == "handed_on" or entry.needs) else None
        return Upstream(results=[r for r in self.results if r.stage in wanted or r is last])


@dataclass(frozen=True)
class Signal:
    """A panel of the pipeline report (eval/pipeline_report.py): metrics a stage's training logs per step,
    drawn on their own axes, one line per metric and run."""

    title: str
    """What the panel shows (e.g. `reward`); the report prefixes the stage's name."""
    metrics: tuple[str, ...]
    """MLflow metric names, each a line."""
    nested: bool = False
    """Read from each run nested under the stage's run with the stage's tag (SFT's sub-stages,
    distillation's rounds), one line per run labelled by its name; else from the stage's own run."""
    when_flat: str | None = None
    """What it means when every point is one value: the report says it instead of a flat line."""


@dataclass(frozen=True)
class Stage:
    """A stage as the pipeline sees it (one entry of flows/registry.py)."""

    name: str
    flow: Callable[..., StageResult]
    """The Prefect flow: flow(ctx, block, upstream) -> StageResult."""
    select: Callable[..., BaseModel | None]
    """recipe -> the flow's `block` (None when the recipe has no block for this stage)."""
    needs: tuple[str, ...] = ()
    """Stages whose results this one reads: they must run in the same pipeline run."""
    start: Literal["none", "handed_on"] = "none"
    """What it trains from. none: nothing handed on (pretraining builds its model from the recipe; merge
    and long context read pretraining's result, `needs`); handed_on: the checkpoint the previous stage
    handed on, else `model.from`."""
    hands_on: Literal["checkpoint", "export"] = "checkpoint"
    """What its result's `checkpoint` is. checkpoint: a model the next stage can start from (merge: the best
    merge or the last trained checkpoint); export: a deployable artifact nothing trains from (quantize's
    quantized export), so no `start="handed_on"` stage may come after it (flows/registry.py checks)."""
    lm_curve: bool = False
    """Its train/lm_loss is drawn on the pipeline report's one token axis (a language-model stage)."""
    signals: tuple[Signal, ...] = ()
    """Its training signals, each drawn on its own axes of the pipeline report (per step)."""
    reads: Callable[[Any], tuple[str, ...]] | None = None
    """block -> the earlier stages it reads beyond the one handed on and `needs`, when present
    (distillation's student and teacher stages; quantization's pretraining data)."""

    @property
    def recipe_block(self) -> type:
        """The class of its recipe block (its StagesConfig field's type), which declares how the stage trains:
        its stretches and how an ablation scales its budget (recipe/blocks/contract.py)."""
        return stage_blocks()[self.name]


@contextmanager
def stage_run(ctx: StageContext, name: str, tags: dict[str, str] | None = None) -> Iterator[str]:
    """The stage's MLflow run (nested under the pipeline's), with the runtime logged as params."""
    with ctx.tracker.run(name, {STAGE_TAG: name.split("/")[0], **ctx.run_tags, **(tags or {})}, ctx.parent_run_id) as run_id:
        ctx.tracker.log_params(run_id, ctx.runtime.params())
        run_logger().info("%s: starting on %s/%s (MLflow run %s)", name, ctx.runtime.device, ctx.runtime.precision, run_id)
        with releasing_new():  # the step leases this stage run took end with it, however it ends
            yield run_id


def _say(result: StageResult, how: str) -> None:
    """The lines a person reads in the stage's log: what happened, what it bought, where to look."""
    log = run_logger()
    log.info("%s: %s", result.stage, how)
    s = result.summary
    if s is not None and s.after is not None:
        before = "-" if s.before is None else f"{s.before:.4g}"
        log.info("%s: %s %s -> %.4g over %s tokens", result.stage, s.metric, before, s.after, f"{s.tokens:,}")
    log.info("%s: hands on %s (MLflow run %s)", result.stage, result.checkpoint, result.run_id)


def reused_result(ctx: StageContext, stage: str, run_id: str, out_dir: Path) -> StageResult | None:
    """A finished step's result, handed back as Cached in Prefect and re-logged to `run_id`; else None
    (this run then holds the step's lease and builds it). Another live run building the step is waited for."""
    claim_step(stage, out_dir, run_id)
    record = finished(out_dir)
    if record is None or not Path(record["result"]["checkpoint"]).exists():
        return None
    record = reuse(stage, out_dir, record)
    trained_in = record["result"].get("trained_in_run") or record["result"]["run_id"]
    result = StageResult.model_validate({**record["result"], "run_id": run_id, "reused": True, "trained_in_run": trained_in})
    step, tokens = record.get("at", (0, 0))
    ctx.tracker.set_tags(run_id, {REUSED_TAG: "true", STAGE_DIR_TAG: str(out_dir),
                                  "stagewise.reused_from_run": record["result"]["run_id"]})
    if record.get("metrics"):
        ctx.tracker.log_metrics(run_id, [(step, tokens, record["metrics"])])
    ctx.tracker.register_checkpoint(ctx.tracker.experiment, Path(result.checkpoint), run_id, alias=stage,
                                    parent=result.parent, lineage=lineage(ctx, result))
    _say(result, f"reused (finished earlier in {out_dir}; trained in MLflow run {trained_in})")
    return result


def lineage(ctx: StageContext, result: StageResult) -> dict[str, str]:
    """Registry tags that let a person walk from a checkpoint version back to how it was made: the
    pipeline's MLflow run, the Prefect flow run (and its page when a Prefect UI serves it), the
    recipe hash, the stage's step directory and the prepared data it read."""
    return {"stagewise.pipeline_run": ctx.parent_run_id or "", "stagewise.recipe_hash": ctx.recipe_hash,
            "stagewise.prefect_flow_run": str(flow_run.get_root_flow_run_id() or "") if flow_run.get_id() else "",
            "stagewise.prefect_flow_run_url": (flow_run.ui_url or "") if flow_run.get_id() else "",
            "stagewise.stage_dir": result.stage_dir or "", "stagewise.data": result.data_root or ""}


def finish(ctx: StageContext, out_dir: Path, result: StageResult, metrics: dict[str, float] | None = None,
           at: tuple[int, int] = (0, 0)) -> StageResult:
    """Register the handed-on checkpoint and write the step's finish marker (last).

    `metrics` (MLflow names) at `at` = (step, tokens) are what a rerun re-logs when it reuses the step.
    A summary with a gain's interval adds its bounds, `<metric>_gain_low` and `<metric>_gain_high`,
    logged here next to the metric."""
    s = result.summary
    if s is not None and s.gain_low is not None:
        bounds = {f"{s.metric}_gain_low": s.gain_low, f"{s.metric}_gain_high": s.gain_high}
        ctx.tracker.log_metrics(result.run_id, [(at[0], at[1], bounds)])
        metrics = {**(metrics or {}), **bounds}
    ctx.tracker.register_checkpoint(ctx.tracker.experiment, Path(result.checkpoint), result.run_id, alias=result.stage,
                                    parent=result.parent, lineage=lineage(ctx, result))
    _say(result, "finished")
    mark_finished(out_dir, {"result": result.model_dump(mode="json"), "metrics": metrics or {}, "at": list(at),
                            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    return result


class StageStateError(RuntimeError):
    """A step directory holds an interrupted run and --resume was not given."""


def resume_point(out_dir: Path, resume: bool) -> CheckpointRef | None:
    """Where an unfinished step continues: nothing (a fresh start), or with --resume its latest checkpoint.

    A step with checkpoints but no finish marker was interrupted; continuing it silently could
    mix two recipes' weights, so it needs --resume (exit 1 naming the directory otherwise)."""
    latest = latest_checkpoint(out_dir)
    if latest is None:
        return None
    meta = read_meta(latest)
    if not resume:
        raise StageStateError(
            f"{out_dir} holds an interrupted run (last checkpoint at {meta.tokens_seen:,} tokens); "
            "pass --resume to continue it, or delete the directory to start over")
    return CheckpointRef(path=str(latest), step=meta.step, tokens_seen=meta.tokens_seen, sha256=meta.weight_sha256 or "")


def checkpoint_hash(path: str | Path) -> str:
    """What identifies a checkpoint as a step input: its weights' sha256 (the path when it has none)."""
    try:
        return read_meta(path).weight_sha256 or str(path)
    except FileNotFoundError:  # a plain Hugging Face checkpoint (model.from) has no stagewise.json
        return str(Path(path).resolve())


NO_START = ("needs a checkpoint to start from: run it after pretraining (--stages pretrain,<stage>; a finished, "
            "unchanged pretrain stage is reused without training) or set model.from to a checkpoint directory")


class StartError(ValueError):
    """A stage that fine-tunes has no checkpoint to start from."""


def start_checkpoint(upstream: Upstream, model_from: str | None) -> str:
    """What a `start="handed_on"` stage trains: the checkpoint the previous stage handed on, else `model.from`."""
    last = upstream.last()
    if last is not None:
        return last.checkpoint
    if model_from:
        return model_from
    raise StartError(NO_START)
