"""The pretraining stage as a Prefect flow: prepare data -> train in stretches -> validate.

Phases share one LR schedule and one data stream; each stretch (a phase, or a gate's
chunk of `eval_every_tokens`) is a task that resumes the previous one's checkpoint, so
the curriculum reads as a list of tasks in the Prefect UI and a crash loses at most one
checkpoint interval (`stagewise run --resume`). The untrained model is scored first, so the
closing table shows the validation loss before and after.

The stage is one content-addressed step (store/steps.py): its directory is named by
`pretrain_spec` (model, training config, phases, epoch caps, gate) and the prepared data's
digest. Re-running an unchanged, finished stage (gate-stopped included) trains nothing and
hands on the recorded checkpoint.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from pydantic import BaseModel, ConfigDict

from stagewise.data.config import DataConfig, TokenizerConfig
from stagewise.data.prepare import PreparedData
from stagewise.engines.launch.stage import run_engine, with_engine
from stagewise.engines.megatron.stage import pretrain_plan
from stagewise.engines.megatron.translate import MLflowTarget, megatron_precision
from stagewise.flows.stage import Stage, StageContext, Upstream, finish, resume_point, reused_result, stage_run
from stagewise.flows.stage_loop import run_stretches
from stagewise.model.config import ModelConfig, TrainConfig
from stagewise.model.train_spec import ShardData, TrainSpec
from stagewise.recipe import PretrainStage, Recipe
from stagewise.refs import CheckpointRef, PreparedRef, StageResult, StageSummary
from stagewise.store.steps import step_dir, value_of
from stagewise.store.tracking import Tracker
from stagewise.tasks.data import prepare_data_task
from stagewise.tasks.evaluate import loss_report_task, suite_task, validation_task

STAGE = "pretrain"
TARGET = "eval/validation/loss"


class PretrainInputs(BaseModel):
    """What pretraining reads from the recipe: its block, the model, the data and the eval suites."""

    model_config = ConfigDict(populate_by_name=True)

    stage: PretrainStage
    model: ModelConfig
    data: DataConfig
    tokenizer: TokenizerConfig
    suites: dict[str, list[str]] = {}


def select(recipe: Recipe) -> PretrainInputs | None:
    if recipe.stages.pretrain is None:
        return None
    return PretrainInputs(stage=recipe.stages.pretrain, model=recipe.model, data=recipe.data,
                          tokenizer=recipe.tokenizer, suites=recipe.eval)


def train_config(stage: PretrainStage, precision: str) -> TrainConfig:
    """The stage's TrainConfig with its precision resolved against the runtime's."""
    cfg = TrainConfig.model_validate(stage.model_dump(include=set(TrainConfig.model_fields)))
    return cfg.model_copy(update={"precision": precision})


def pretrain_spec(block: PretrainInputs, train: TrainConfig, seed: int) -> dict:
    """What determines the stage's weights and the checkpoint it hands on (hashed with the data digest).

    Epoch caps change what the loader reads; a gate (with what it evaluates) changes which
    checkpoint is handed on. Evaluation-only settings (eval_suite, val_tokens without a gate)
    and the data's `quality` labels are left out."""
    gate = block.stage.gate
    spec = {
        "model": block.model, "train": train, "phases": block.stage.phases, "seed": seed,
        "max_epochs": {s.name: s.max_epochs for s in block.data.sources},
        "gate": None if gate is None else [gate, block.suites.get(gate.suite or ""), block.stage.val_tokens],
    }
    return with_engine(spec, block.stage)


def evaluator(prepared: PreparedRef, seq_length: int, val_tokens: int, suite: list[str] | None,
              limit: int | None, tracker: Tracker, run_id: str, device: str = "cpu"):
    """What a pretraining checkpoint is scored on at every mark: validation loss (+ a suite)."""
    def evaluate(ckpt: CheckpointRef) -> dict:
        metrics = validation_task(ckpt, prepared, seq_length, val_tokens, tracker, run_id, device=device)
        if suite:
            metrics |= suite_task(ckpt, suite, limit, tracker, run_id, device=device)
        return metrics
    return evaluate


@flow(name="pretrain")
def pretrain_flow(ctx: StageContext, block: PretrainInputs, upstream: Upstream | None = None) -> StageResult:
    """Phased pretraining of `block.stage` (a `stages.pretrain` block) on the recipe's data."""
    logger = get_run_logger()
    stage, tracker = block.stage, ctx.tracker
    with stage_run(ctx, STAGE) as run_id:
        prepared = value_of(prepare_data_task(block.data, block.tokenizer, ctx.workdir, ctx.seed, ctx.base_dir,
                                              tracker, run_id))
        launched = stage.engine != "torch"
        train_cfg = train_config(stage, megatron_precision(stage.precision) if launched
                                 else ctx.runtime.precision_for(stage.precision))
        out_dir = step_dir(ctx.stages_root, STAGE, pretrain_spec(block, train_cfg, ctx.seed), [prepared.digest])
        reused = reused_result(ctx, STAGE, run_id, out_dir)
        if reused is not None:
            logger.info("pretrain already finished in %s: reusing %s", out_dir, reused.checkpoint)
            return reused
        if launched:
            return _on_megatron(ctx, block, train_cfg, prepared, run_id, out_dir)
        spec = TrainSpec(
            stage=STAGE, model=block.model, train=train_cfg, out_dir=str(out_dir), seed=ctx.seed,
            recipe_hash=ctx.recipe_hash, device=ctx.runtime.device,
            data=ShardData(prepared=prepared, phases=stage.phases,
                           max_epochs={s.name: s.max_epochs for s in block.data.sources}),
        )
        total = train_cfg.total_steps * train_cfg.tokens_per_step
        gate = stage.gate
        suite_name = gate.suite if gate else stage.eval_suite
        evaluate = evaluator(prepared, train_cfg.seq_length, stage.val_tokens,
                             block.suites.get(suite_name) if suite_name else None,
                             gate.eval_limit if gate else None, tracker, run_id, ctx.runtime.device)
        phase_ends = [(p.name, round(p.until * train_cfg.tokens)) for p in stage.phases]
        ckpt, decision = run_stretches(spec, phase_ends, total, resume_point(out_dir, ctx.resume), evaluate,
                                       tracker, run_id, gate, evaluate_start=True)
        return _handed_on(ctx, block, train_cfg, prepared, ckpt, decision, run_id, out_dir, loss_report=True)


def _handed_on(ctx: StageContext, block: PretrainInputs, train_cfg: TrainConfig, prepared: PreparedRef,
               ckpt: CheckpointRef, decision: dict | None, run_id: str, out_dir, loss_report: bool) -> StageResult:
    """Score the checkpoint the stage hands on (whichever engine trained it) and finish the step."""
    tracker = ctx.tracker
    metrics = validation_task(ckpt, prepared, train_cfg.seq_length, block.stage.val_tokens, tracker, run_id,
                              device=ctx.runtime.device)
    if loss_report:
        loss_report_task(tracker, run_id, STAGE)
    history = tracker.metric_histories(run_id, [TARGET]).get(TARGET, [])
    before = next((v for step, _, v in history if step == 0), None)
    summary = StageSummary(metric=TARGET, before=before, after=metrics["loss"], tokens=ckpt.tokens_seen)
    headline = {f"validation_{k}": v for k, v in metrics.items() if k in ("loss", "unigram_baseline")}
    result = StageResult(stage=STAGE, checkpoint=ckpt.path, run_id=run_id, gate=decision, metrics=headline,
                         data_root=prepared.root, stage_dir=str(out_dir), summary=summary)
    final = {f"eval/validation/{k}": v for k, v in metrics.items()}
    return finish(ctx, out_dir, result, final, at=(ckpt.step, ckpt.tokens_seen))


def _on_megatron(ctx: StageContext, block: PretrainInputs, train_cfg: TrainConfig, prepared: PreparedRef, run_id: str,
                 out_dir) -> StageResult:
    """The stage trained by Megatron-Bridge (engines/megatron/stage.py), scored here like ours."""
    stage = block.stage
    mlflow = MLflowTarget(ctx.tracker.uri, ctx.tracker.experiment, run_id, STAGE)
    plan = pretrain_plan(train_cfg, stage.phases, block.model, stage.launch, prepared.root, out_dir, ctx.seed, mlflow)
    tokenizer = str(PreparedData.load(prepared.root).tokenizer_dir)
    ckpt = run_engine(ctx, STAGE, stage.engine, stage.launch, run_id, out_dir, plan, parent=None, tokenizer_dir=tokenizer)
    return _handed_on(ctx, block, train_cfg, prepared, ckpt, None, run_id, out_dir, loss_report=False)


STAGE_ENTRY = Stage(name=STAGE, flow=pretrain_flow, select=select, lm_curve=True)
