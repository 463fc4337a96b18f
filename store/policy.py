"""How every stagewise task behaves in Prefect: one place for retries, caching and results.

- Tasks that read or write MLflow or the filesystem retry transient failures (a server
  restarting, a timeout, a locked SQLite file) with growing delays, and never retry
  deterministic ones (bad input, a gate's decision, divergence): `store.retry.retry_if_transient`.
- Training is not retried by Prefect: a stretch is long, its metrics already survive an MLflow
  outage (Tracker's spool), and a crash is continued exactly with `stagewise run --resume`.
- Results are small references (paths, digests, metric dicts, never tensors), persisted so a
  run can be inspected and retried from the Prefect UI.
- Prefect's own cache is off (NO_CACHE): reuse is decided by content-addressed directories
  (store/steps.py), and a reused step reports itself as Cached with the step hash as its key.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import get_run_logger
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError

from stagewise.store.retry import retry_if_transient

RETRY_DELAYS_S = [2, 10, 30]


def retrying(name: str) -> dict[str, Any]:
    """`@task(**retrying("name"))`: a task that touches MLflow or files."""
    return {"name": name, "cache_policy": NO_CACHE, "persist_result": True, "retries": len(RETRY_DELAYS_S),
            "retry_delay_seconds": RETRY_DELAYS_S, "retry_condition_fn": retry_if_transient}


def once(name: str) -> dict[str, Any]:
    """`@task(**once("name"))`: a task Prefect must not rerun by itself (training)."""
    return {"name": name, "cache_policy": NO_CACHE, "persist_result": True}


def run_logger():
    """The Prefect run logger inside a flow or task, a plain `stagewise` logger elsewhere (a task's
    `.fn` in a test or notebook), so task and stage bodies log the same way wherever they run."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("stagewise")
