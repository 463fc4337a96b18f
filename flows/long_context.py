"""Long-context continued pretraining as a Prefect flow (ALGORITHMS.md section 3).

From the base checkpoint (the merge's, or pretraining's): generate document-QA shards,
blend them with synthetic retrieval and downscaled phase-2 data, and train at a constant
LR on a mix of long and short sequences, each step a fixed token budget. Retrieval
(needle) accuracy and per-length loss are measured before and after, so the report shows
long-context gains next to any short-context regression.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prefect import flow, get_run_logger

from flows.stage_loop import run_stretches
from flows.stage_schemas import LongContextStage
from model.config import ModelConfig
from tasks.long_context import doc_qa_task, needle_task
from tasks.refs import CheckpointRef, StageResult
from tasks.tracking import STAGE_TAG, Tracker
from tasks.train import LongContextData, TrainSpec

STAGE = "long_context"


def _shards(data_root: str) -> tuple[dict[str, str], dict[str, str]]:
    """Train and val shard dirs of every prepared pretraining source."""
    from data.prepare import PreparedData

    prepared = PreparedData.load(Path(data_root))
    return ({n: str(s.train) for n, s in prepared.sources.items()},
            {n: str(s.val) for n, s in prepared.sources.items() if s.val_tokens > 0})


@flow(name="long_context", log_prints=True)
def long_context_flow(
    stage: LongContextStage,
    base: StageResult,
    phase2_blend: dict[str, float],
    model: ModelConfig,
    workdir: str,
    seed: int,
    recipe_hash: str,
    tracker: Tracker,
    parent_run_id: str | None = None,
    resume: bool = False,
    device: str = "cpu",
) -> StageResult:
    """Continue pretraining `base.checkpoint` on long sequences; returns the long-context checkpoint."""
    from data.long_context import DOC_QA, long_context_blend

    logger = get_run_logger()
    if not base.data_root:
        raise ValueError("the long_context stage needs the pretraining data of the same run (run pretrain first)")
    with tracker.run(STAGE, {STAGE_TAG: STAGE}, parent_run_id) as run_id:
        doc_qa = doc_qa_task(base.checkpoint, stage.data.doc_qa, seed, workdir)
        train_shards, val_shards = _shards(base.data_root)
        train_shards[DOC_QA], val_shards[DOC_QA] = doc_qa["train"], doc_qa["val"]
        blend = long_context_blend(stage.data, phase2_blend)
        tracker.log_json(run_id, blend, "long_context/blend.json")
        train_cfg = stage.train_config()
        key = json.dumps([stage.model_dump(), base.checkpoint, blend, seed], sort_keys=True, default=str)
        out_dir = Path(workdir) / "stages" / f"{STAGE}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        spec = TrainSpec(
            stage=STAGE, model=ModelConfig(preset=None, **{"from": base.checkpoint}, mtp=model.mtp), train=train_cfg,
            data=LongContextData(shards=train_shards, config=stage.data, blend=blend, tokenizer_dir=base.checkpoint),
            out_dir=str(out_dir), seed=seed, recipe_hash=recipe_hash, parent=base.checkpoint, device=device,
        )
        start_ref = CheckpointRef(path=base.checkpoint, step=0, tokens_seen=0)
        before = needle_task(start_ref, stage.needle_lengths, stage.needle_per_length, val_shards, seed, tracker, run_id, at=(0, 0))

        last: dict[str, dict] = {}

        def evaluate(ckpt: CheckpointRef) -> dict:
            last[ckpt.path] = needle_task(ckpt, stage.needle_lengths, stage.needle_per_length, val_shards, seed,
                                          tracker, run_id)
            return last[ckpt.path]

        from flows.pretrain import existing_checkpoint

        total = train_cfg.total_steps * train_cfg.tokens_per_step
        start = existing_checkpoint(out_dir, total, resume)
        ckpt, _ = run_stretches(spec, [(STAGE, total)], total, start, evaluate, tracker, run_id)
        after = last.get(ckpt.path) or evaluate(ckpt)  # a reused, finished stage was not evaluated yet
        deltas = {f"long_context/delta/{k.removeprefix('eval/')}": after[k] - before[k] for k in before if k in after}
        tracker.log_metrics(run_id, [(ckpt.step, ckpt.tokens_seen, deltas)])
        tracker.log_json(run_id, {"before": before, "after": after, "delta": deltas}, "reports/long_context.json")
        logger.info("long context: %s", ", ".join(f"{k}={v:+.3f}" for k, v in sorted(deltas.items())))
        tracker.register_checkpoint(tracker.experiment, Path(ckpt.path), run_id, alias=STAGE)
    return StageResult(stage=STAGE, checkpoint=ckpt.path, run_id=run_id, metrics={k.split("/", 2)[-1]: v for k, v in deltas.items()},
                       data_root=base.data_root, stage_dir=str(out_dir))
