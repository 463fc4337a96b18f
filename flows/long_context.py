"""Long-context continued pretraining as a Prefect flow (ALGORITHMS.md section 3).

From the base checkpoint (the merge's, or pretraining's): generate document-QA shards,
blend them with synthetic retrieval and downscaled phase-2 data, and train at a constant
LR on a mix of long and short sequences, each step a fixed token budget. Retrieval
(needle) accuracy and per-length loss are measured before and after, so the report shows
long-context gains next to any short-context regression.

With `engine: megatron` the same blend is trained by Megatron-Bridge at the block's single
length (engines/megatron/stage.py: import, train, export, adopted as our checkpoint) and
scored by the same needle evaluation.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from pydantic import BaseModel

from stagewise.data.long_context import DOC_QA, long_context_blend
from stagewise.data.prepare import PreparedData
from stagewise.engines.config import where_free
from stagewise.engines.launch.stage import run_engine, with_engine
from stagewise.engines.megatron.stage import long_context_datasets, long_context_plan
from stagewise.engines.megatron.translate import MLflowTarget, long_context_train_config, megatron_precision
from stagewise.flows.stage import (
    Stage,
    StageContext,
    Upstream,
    checkpoint_hash,
    finish,
    resume_point,
    reused_result,
    stage_run,
)
from stagewise.flows.stage_loop import run_stretches
from stagewise.model.config import ModelConfig, MTPConfig, TrainConfig
from stagewise.model.train_spec import LongContextData, TrainSpec
from stagewise.recipe import Recipe
from stagewise.recipe.blocks.long_context import LongContextStage
from stagewise.refs import CheckpointRef, StageResult, StageSummary
from stagewise.store.steps import step_dir, value_of
from stagewise.tasks.long_context import doc_qa_task, needle_task

STAGE = "long_context"


class LongContextInputs(BaseModel):
    """What long-context training reads from the recipe: its block, the last pretraining phase's
    blend (downscaled into the mix) and the model's MTP heads."""

    stage: LongContextStage
    phase2_blend: dict[str, float]
    mtp: MTPConfig = MTPConfig()


def select(recipe: Recipe) -> LongContextInputs | None:
    if recipe.stages.long_context is None:
        return None
    blend = recipe.stages.pretrain.phases[-1].blend if recipe.stages.pretrain else {}
    return LongContextInputs(stage=recipe.stages.long_context, phase2_blend=blend, mtp=recipe.model.mtp)


def _shards(data_root: str) -> tuple[dict[str, str], dict[str, str]]:
    """Train and val shard dirs of every prepared pretraining source."""
    prepared = PreparedData.load(Path(data_root))
    return ({n: str(s.train) for n, s in prepared.sources.items()},
            {n: str(s.val) for n, s in prepared.sources.items() if s.val_tokens > 0})


def long_context_spec(block: LongContextInputs, train, blend: dict, seed: int) -> dict:
    """What determines the stage's weights (hashed with the base checkpoint and the pretraining data)."""
    return {"stage": where_free(block.stage), "train": train, "blend": blend, "mtp": block.mtp, "seed": seed}


def train_config(stage: LongContextStage, runtime_precision) -> TrainConfig:
    """The block as the engine that trains it counts steps, precision resolved: ours fills a step of
    `global_batch_tokens` with the length mix (rows of the shortest length); Megatron-Bridge trains
    one length (megatron_bridge.long_context_train_config) in bf16 on GPUs, whatever this machine is."""
    if stage.engine == "megatron":
        cfg = long_context_train_config(stage)
        return cfg.model_copy(update={"precision": megatron_precision(cfg.precision)})
    cfg = stage.train_config()
    return cfg.model_copy(update={"precision": runtime_precision(cfg.precision)})


@flow(name="long_context")
def long_context_flow(ctx: StageContext, block: LongContextInputs, upstream: Upstream) -> StageResult:
    """Continue pretraining the checkpoint handed on (merge's or pretraining's) on long sequences."""
    logger = get_run_logger()
    stage, tracker, seed = block.stage, ctx.tracker, ctx.seed
    base = upstream.last()
    if base is None or not base.data_root:
        raise ValueError("the long_context stage needs the pretraining data of the same run (run pretrain first)")
    with stage_run(ctx, STAGE) as run_id:
        blend = long_context_blend(stage.data, block.phase2_blend)
        train_cfg = train_config(stage, ctx.runtime.precision_for)
        spec = with_engine(long_context_spec(block, train_cfg, blend, seed), stage)
        out_dir = step_dir(ctx.stages_root, STAGE, spec, [checkpoint_hash(base.checkpoint), Path(base.data_root).name])
        reused = reused_result(ctx, STAGE, run_id, out_dir)
        if reused is not None:
            logger.info("long context already finished in %s: reusing %s", out_dir, reused.checkpoint)
            return reused
        tracker.log_json(run_id, blend, "long_context/blend.json")
        doc_qa = value_of(doc_qa_task(base.checkpoint, stage.data.doc_qa, seed, ctx.workdir))
        train_shards, val_shards = _shards(base.data_root)
        train_shards[DOC_QA], val_shards[DOC_QA] = doc_qa["train"], doc_qa["val"]
        model = ModelConfig(preset=None, **{"from": base.checkpoint}, mtp=block.mtp)
        start_ref = CheckpointRef(path=base.checkpoint, step=0, tokens_seen=0)
        before = needle_task(start_ref, stage.needle_lengths, stage.needle_per_length, val_shards, seed, tracker, run_id,
                             at=(0, 0), device=ctx.runtime.device)

        last: dict[str, dict] = {}

        def evaluate(ckpt: CheckpointRef) -> dict:
            last[ckpt.path] = needle_task(ckpt, stage.needle_lengths, stage.needle_per_length, val_shards, seed,
                                          tracker, run_id, device=ctx.runtime.device)
            return last[ckpt.path]

        if stage.engine == "megatron":
            ckpt = _on_megatron(ctx, stage, model, blend, base, doc_qa["train"], run_id, out_dir)
        else:
            train = TrainSpec(
                stage=STAGE, model=model, train=train_cfg, out_dir=str(out_dir), seed=seed, recipe_hash=ctx.recipe_hash,
                data=LongContextData(shards=train_shards, config=stage.data, blend=blend, tokenizer_dir=base.checkpoint),
                parent=base.checkpoint, device=ctx.runtime.device,
            )
            total = train_cfg.total_steps * train_cfg.tokens_per_step
            ckpt, _ = run_stretches(train, [(STAGE, total)], total, resume_point(out_dir, ctx.resume), evaluate,
                                    tracker, run_id)
        after = last.get(ckpt.path) or evaluate(ckpt)  # resumed after its training had finished, or launched
        deltas = {f"long_context/delta/{k.removeprefix('eval/')}": after[k] - before[k] for k in before if k in after}
        tracker.log_metrics(run_id, [(ckpt.step, ckpt.tokens_seen, deltas)])
        tracker.log_json(run_id, {"before": before, "after": after, "delta": deltas}, "reports/long_context.json")
        logger.info("long context: %s", ", ".join(f"{k}={v:+.3f}" for k, v in sorted(deltas.items())))
        target = f"eval/loss/{max(stage.needle_lengths)}"
        summary = StageSummary(metric=target, before=before.get(target), after=after.get(target), tokens=ckpt.tokens_seen)
        result = StageResult(stage=STAGE, parent=base.checkpoint, checkpoint=ckpt.path, run_id=run_id,
                             summary=summary,
                             metrics={k.split("/", 2)[-1]: v for k, v in deltas.items()},
                             data_root=base.data_root, stage_dir=str(out_dir))
        return finish(ctx, out_dir, result, {**after, **deltas}, at=(ckpt.step, ckpt.tokens_seen))


def _on_megatron(ctx: StageContext, stage: LongContextStage, model: ModelConfig, blend: dict[str, float], base,
                 doc_qa_train: str, run_id: str, out_dir: Path) -> CheckpointRef:
    """The stage trained by Megatron-Bridge (engines/megatron/stage.py) on the blend our loader samples."""
    mlflow = MLflowTarget(ctx.tracker.uri, ctx.tracker.experiment, run_id, STAGE)
    datasets = long_context_datasets(blend, base.data_root, doc_qa_train)
    plan = long_context_plan(stage, model, stage.launch, base.checkpoint, out_dir, ctx.seed, mlflow, datasets)
    return run_engine(ctx, STAGE, stage.engine, stage.launch, run_id, out_dir, plan, parent=base.checkpoint,
                      tokenizer_dir=base.checkpoint)


STAGE_ENTRY = Stage(name=STAGE, flow=long_context_flow, select=select, needs=("pretrain",), lm_curve=True)
