"""Who runs the build's steps: this process, or Ray tasks. Both return results in submission order.

    with executor_for(cfg) as run:
        summaries = run.map(scan_unit, [(unit, filters, p, work) for unit in units], phase="scan")

`InProcess` calls the function in a loop. `RayTasks` submits each call as a Ray task reserving
`cpus_per_worker` CPUs, at most `workers` in flight, so on a small machine reads and tokenization are
never starved by a pool holding every core (Ray Data's actor pools stalled that way here). Each task
tokenizes with one thread (TOKENIZERS_PARALLELISM=false in the workers). A phase where no task
finishes for `no_progress_s` fails with `Starved`, naming the phase, instead of waiting forever. A
worker lost mid-task is retried by Ray (`max_retries`); the steps are idempotent, so a retry redoes
only that unit. Ray is imported only by `RayTasks` (an optional dependency: the `ray` extra).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from stagewise.data.corpus.config import CorpusBuildConfig, RayConfig

WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
"""One thread per task: the executor, not the tokenizer, decides how many cores work."""


class Starved(RuntimeError):
    """No work unit of a phase finished within no_progress_s."""


@contextmanager
def _bar(phase: str, total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """advance(): one line per phase, `<phase> 12/16 units`, or a no-op."""
    if not enabled or total == 0:
        yield lambda: None
        return
    columns = [TextColumn(f"{phase:<12}"), BarColumn(), MofNCompleteColumn(), TextColumn("units"),
               TimeElapsedColumn()]
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(phase, total=total)
        yield lambda: bar.advance(task)


class InProcess:
    """Every call in this process, one after another."""

    name = "in_process"

    def __init__(self, progress: bool = False) -> None:
        self.progress = progress
        self.nodes = {"local"}

    def map(self, fn: Callable, calls: Sequence[tuple], phase: str) -> list[Any]:
        out = []
        with _bar(phase, len(calls), self.progress) as advance:
            for args in calls:
                out.append(fn(*args))
                advance()
        return out


def _on_node(fn: Callable, *args: Any) -> tuple[str, Any]:
    """(the Ray node that ran it, fn(*args)): what a Ray task runs, so the build can say which nodes worked."""
    import ray  # noqa: PLC0415  (optional dependency: the `ray` extra)

    return ray.get_runtime_context().get_node_id(), fn(*args)


class RayTasks:
    """Every call as a Ray task; see the module docstring. `nodes` collects the ids of the nodes that ran one."""

    name = "ray"

    def __init__(self, cfg: RayConfig, progress: bool = False) -> None:
        import ray  # noqa: PLC0415  (optional dependency: the `ray` extra)

        self.ray, self.cfg, self.progress = ray, cfg, progress
        self.nodes: set[str] = set()

    def map(self, fn: Callable, calls: Sequence[tuple], phase: str) -> list[Any]:
        ray, cfg = self.ray, self.cfg
        remote = ray.remote(num_cpus=cfg.cpus_per_worker, max_retries=3)(_on_node)
        results: list[Any] = [None] * len(calls)
        pending: dict[Any, int] = {}
        next_call = 0
        with _bar(phase, len(calls), self.progress) as advance:
            while next_call < len(calls) or pending:
                while next_call < len(calls) and len(pending) < cfg.workers:
                    pending[remote.remote(fn, *calls[next_call])] = next_call
                    next_call += 1
                started = time.monotonic()
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=cfg.no_progress_s)
                if not ready:
                    for ref in pending:
                        ray.cancel(ref, force=True)
                    raise Starved(f"corpus build: no {phase} task finished in {time.monotonic() - started:.0f} s "
                                  f"(data.build.ray.no_progress_s={cfg.no_progress_s:g}); {len(pending)} in flight, "
                                  f"{len(calls) - next_call} waiting: the cluster has no free CPUs for them, or its "
                                  "workers were lost")
                for ref in ready:
                    node, results[pending.pop(ref)] = ray.get(ref)
                    self.nodes.add(node)
                    advance()
        return results


@contextmanager
def executor_for(cfg: CorpusBuildConfig, progress: bool = False) -> Iterator[InProcess | RayTasks]:
    """The configured executor; for Ray, connected to `ray.address` or to a local cluster started here
    (and shut down when the build ends, whatever happens)."""
    if cfg.executor == "in_process":
        yield InProcess(progress)
        return
    import ray  # noqa: PLC0415  (optional dependency: the `ray` extra)

    if ray.is_initialized():
        yield RayTasks(cfg.ray, progress)
        return
    local = cfg.ray.address is None
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": WORKER_ENV}, "log_to_driver": False,
                              "logging_level": "ERROR"}
    if local:  # a small object store: the steps pass paths and counts, never data
        kwargs |= {"num_cpus": max(1, round(cfg.ray.workers * cfg.ray.cpus_per_worker)),
                   "object_store_memory": 256 * 1024**2, "include_dashboard": False}
    ray.init(address=cfg.ray.address or "local", **kwargs)  # "local": a new cluster even where `ray start` runs one
    try:
        yield RayTasks(cfg.ray, progress)
    finally:
        ray.shutdown()
