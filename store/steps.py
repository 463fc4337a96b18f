"""Content-addressed steps: one name, one finish marker and one reuse rule for every stage.

A step's directory is `<root>/<kind>-<hash>`, the hash over the spec it builds from and
its inputs' hashes (Marin's executor rule): re-running an unchanged step does nothing, and
any change to what determines its output gives a new directory. Output locations and
bookkeeping (`out_dir`, `workdir`, run ids, the tracker) never enter the hash, so moving a
workdir or a different MLflow store does not retrain.

A step is finished when its marker (`finished.json`, written last and atomically) exists;
the marker records what the step hands on (a StageResult's fields, its headline metrics), so
a rerun reuses it without opening a checkpoint. A directory with checkpoints and no marker
is an interrupted step: it continues only with `--resume`. A run claims a step before it looks
at it (`claim_step`, store/leases.py): while another live run builds it, this one waits, then
reuses it. In Prefect, a reused step is one
task run in the Cached state whose cache key is the step hash and whose message says what
was reused, so the UI and the directories tell the same story.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from prefect import task
from prefect.client.schemas.objects import StateDetails
from prefect.states import Completed, State

from stagewise.data.content_hash import step_hash
from stagewise.store.jobs import recorded, stop_recorded
from stagewise.store.leases import claim, describe, release, ttl_s, wait_for
from stagewise.store.policy import once, retrying, run_logger

MARKER = "finished.json"


def step_dir(root: str | Path, kind: str, spec: Any, inputs: Iterable[str] = ()) -> Path:
    """`<root>/<kind>-<step_hash>`."""
    return Path(root) / f"{kind}-{step_hash(kind, spec, inputs)}"


def finished(directory: str | Path) -> dict | None:
    """The record a finished step left (None if it has not finished)."""
    marker = Path(directory) / MARKER
    if not marker.is_file():
        return None
    return json.loads(marker.read_text())


def mark_finished(directory: str | Path, record: dict) -> None:
    """Write the finish marker atomically (temp file, fsync, rename): the step's last act."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{MARKER}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MARKER)
    release(directory)  # the step is done: a run waiting on it reuses it now


def cached(value: Any, key: str, message: str) -> State:
    """A task's return value as Prefect's Cached state (a Completed state so named), with the step
    hash as its cache key and `message` saying what was reused; the caller unwraps it with `value_of`."""
    return Completed(name="Cached", data=value, message=message, state_details=StateDetails(cache_key=key))


def value_of(returned: Any) -> Any:
    """What a task returned, whether it ran (the value) or reported a reuse (a Cached state)."""
    return returned.result() if isinstance(returned, State) else returned


@task(**retrying("reuse-step"))
def reuse_step_task(kind: str, directory: str, record: dict) -> State:
    """Hand back a finished step's record as a Cached task run (cache key: the step hash)."""
    key = Path(directory).name.removeprefix(f"{kind}-")
    what = (record.get("result") or {}).get("checkpoint") or directory
    return cached(record, key, f"{kind}: reused {what} (step {key}, finished earlier)")


def reuse(kind: str, directory: str | Path, record: dict) -> dict:
    """Report a finished step's `record` to Prefect as a Cached task run, and return it."""
    return value_of(reuse_step_task(kind, str(directory), record))


def _is_finished(directory: Path) -> bool:
    return finished(directory) is not None


@task(**once("wait-for-step"))
def wait_for_step_task(kind: str, directory: str, holder: str) -> None:
    """Wait while another live run builds the step (this task run stays Running, its log says for whom)."""
    run_logger().info("%s: %s is building %s; waiting for it to finish", kind, holder, directory)
    wait_for(Path(directory), _is_finished)


def claim_step(kind: str, directory: str | Path, run_id: str | None) -> bool:
    """Claim the step at `directory` for this run before looking at it (store/leases.py): True when this
    run now builds it (it holds the lease until mark_finished or the end of its stage run), False when
    it is finished, maybe after waiting for the live run that was building it."""
    def on_wait(d: Path, holder: dict) -> None:
        run_logger().info("%s: waiting for %s, which is building %s", kind, describe(holder), d)
        wait_for_step_task(kind, str(d), describe(holder))

    def on_takeover(d: Path, dead: dict) -> None:
        run_logger().warning("%s: %s stopped building %s (its process is gone, or no heartbeat for %.0f s): "
                             "this run takes the step over", kind, describe(dead), d, ttl_s())
        job = recorded(d)
        if job is not None:  # its scheduler job may still run and write here: stopped before anything else
            run_logger().warning("%s: cancelling the %s job %s (%s) that run left behind, and waiting for it to end",
                                 kind, job.scheduler, job.id, job.name)
            stop_recorded(d)

    return claim(directory, run_id, _is_finished, on_wait, on_takeover) is not None
