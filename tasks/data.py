"""Prefect task: turn the recipe's sources into tokenized shards (a no-op when unchanged)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from stagewise.data.config import DataConfig, TokenizerConfig
from stagewise.data.prepare import prepare_data
from stagewise.refs import PreparedRef
from stagewise.store.policy import retrying, run_logger
from stagewise.store.steps import cached
from stagewise.store.tracking import Tracker


@task(**retrying("prepare-data"))
def prepare_data_task(
    data: DataConfig,
    tokenizer: TokenizerConfig,
    workdir: str,
    seed: int,
    base_dir: str,
    tracker: Tracker | None = None,
    run_id: str | None = None,
) -> PreparedRef:
    """Prepare (or reuse) the data and log per-source token counts to the stage run.

    Returns a PreparedRef, or a Cached state holding it when the digest's directory was reused
    (unwrap with store.steps.value_of)."""
    prepared = prepare_data(data, tokenizer, Path(workdir), seed, base_dir=Path(base_dir))
    logger = run_logger()
    logger.info("data %s at %s (%s)", prepared.digest[:12], prepared.root, "reused" if prepared.reused else "built")
    if tracker and run_id:
        counts = {}
        for name, src in prepared.sources.items():
            counts[f"data/{name}/train_tokens"] = src.train_tokens
            counts[f"data/{name}/val_tokens"] = src.val_tokens
            counts[f"data/{name}/bad_lines"] = src.bad_lines
        tracker.log_metrics(run_id, [(0, 0, counts)])
        tracker.set_tags(run_id, {"stagewise.data_digest": prepared.digest})
    ref = PreparedRef(root=str(prepared.root), digest=prepared.digest)
    if prepared.reused:
        return cached(ref, prepared.digest[:16], f"data: reused {prepared.root} (digest {prepared.digest[:16]})")
    return ref
