"""Prefect task: turn the recipe's sources into tokenized shards (a no-op when unchanged)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from data.config import DataConfig, TokenizerConfig
from tasks.refs import PreparedRef
from tasks.tracking import Tracker


@task(name="prepare-data", cache_policy=NO_CACHE)
def prepare_data_task(
    data: DataConfig,
    tokenizer: TokenizerConfig,
    workdir: str,
    seed: int,
    base_dir: str,
    tracker: Tracker | None = None,
    run_id: str | None = None,
) -> PreparedRef:
    """Prepare (or reuse) the data and log per-source token counts to the stage run."""
    from data.prepare import prepare_data

    prepared = prepare_data(data, tokenizer, Path(workdir), seed, base_dir=Path(base_dir))
    logger = get_run_logger()
    logger.info("data %s at %s (%s)", prepared.digest[:12], prepared.root, "reused" if prepared.reused else "built")
    if tracker and run_id:
        counts = {}
        for name, src in prepared.sources.items():
            counts[f"data/{name}/train_tokens"] = src.train_tokens
            counts[f"data/{name}/val_tokens"] = src.val_tokens
        tracker.log_metrics(run_id, [(0, 0, counts)])
        tracker.set_tags(run_id, {"stagewise.data_digest": prepared.digest})
    return PreparedRef(root=str(prepared.root), digest=prepared.digest)
