"""A scheduler job a step has submitted, recorded beside the step's lease: what to cancel, and how to tell it ended.

A launched step (engines/launch) runs as a Slurm job or a Kubernetes Job, which outlives the process
that submitted it unless someone stops it: a run interrupted by Ctrl-C or a cancelled flow run, or
a SIGKILLed one whose lease another run takes over. So the job is recorded in the step directory
as soon as the scheduler names it (`<step>/.job`: scheduler, id, name, the completion marker the job
writes), and

- the submitting run cancels it before it exits on an interruption (engines/launch/scheduler_job.py);
- a run that takes over the dead holder's lease (store/steps.py `claim_step`) cancels the job the
  holder recorded and waits until the scheduler says it ended before the step is built again, so
  two jobs never write one step directory.

What "ended" means here is the scheduler's record: Slurm's `scontrol show job` (there may be no
`sacct`: accounting is often off) while the record lasts (MinJobAge after the end), then "no such
job", which counts as ended; Kubernetes' Job, deleted with its pods (`--wait`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

JOB = ".job"
POLL_S = 2.0
"""How often a job's state is read while waiting."""
SLURM_ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
               "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT")
"""Slurm job states after which nothing of the job runs any more."""


@dataclass(frozen=True)
class JobRecord:
    """One submitted job of a step."""

    scheduler: str
    """slurm or kubernetes."""
    id: str
    """Slurm's job id; a Kubernetes Job's `<namespace>/<name>`."""
    name: str
    """The launch's name (e.g. `pretrain-train`), for messages."""
    marker: str | None = None
    """The file the job writes its exit status to as it ends (None: it writes none)."""


@dataclass(frozen=True)
class SlurmState:
    """What `scontrol show job` says of a job."""

    state: str
    """JobState (PENDING, RUNNING, COMPLETED, CANCELLED, ...)."""
    reason: str
    """Why it waits or why it ended (Reason: None, Resources, PartitionConfig, ...)."""
    exit_code: str
    """ExitCode as `status:signal`."""

    @property
    def ended(self) -> bool:
        return self.state in SLURM_ENDED


def record(step_dir: str | Path, job: JobRecord) -> None:
    """Record `job` in the step directory (replacing an earlier record), atomically."""
    path = Path(step_dir) / JOB
    tmp = path.with_name(f"{JOB}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(asdict(job)))
    os.replace(tmp, path)


def recorded(step_dir: str | Path) -> JobRecord | None:
    """The job recorded in the step directory, or None."""
    try:
        return JobRecord(**json.loads((Path(step_dir) / JOB).read_text()))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def forget(step_dir: str | Path, job: JobRecord) -> None:
    """Remove the record of `job` (a record of another job is left alone)."""
    if recorded(step_dir) == job:
        (Path(step_dir) / JOB).unlink(missing_ok=True)


def slurm_state(job_id: str) -> SlurmState | None:
    """The job's state from `scontrol show job`, or None once Slurm has no record of it."""
    proc = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr or "Invalid job id" in proc.stdout:
            return None
        raise RuntimeError(f"scontrol show job {job_id}: {proc.stderr.strip() or proc.stdout.strip()}")
    fields = dict(part.split("=", 1) for part in proc.stdout.split() if "=" in part)
    return SlurmState(fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None"), fields.get("ExitCode", "?"))


def cancel(job: JobRecord) -> None:
    """Ask the scheduler to stop `job` (a job that already ended is no error)."""
    if job.scheduler == "slurm":
        subprocess.run(["scancel", job.id], capture_output=True, text=True)
    elif job.scheduler == "kubernetes":
        namespace, name = job.id.split("/", 1)
        subprocess.run(["kubectl", "-n", namespace, "delete", "job", name, "--ignore-not-found", "--wait=true",
                        "--cascade=foreground"], capture_output=True, text=True)
    else:
        raise ValueError(f"unknown scheduler {job.scheduler!r}")


def ended(job: JobRecord) -> bool:
    """Whether nothing of `job` runs any more, as its scheduler says."""
    if job.scheduler == "slurm":
        state = slurm_state(job.id)
        return state is None or state.ended
    namespace, name = job.id.split("/", 1)
    proc = subprocess.run(["kubectl", "-n", namespace, "get", "job", name, "--ignore-not-found", "-o", "name"],
                          capture_output=True, text=True)
    return proc.returncode == 0 and not proc.stdout.strip()


def cancel_and_wait(job: JobRecord, timeout_s: float = 300.0) -> None:
    """Cancel `job` and return once its scheduler says it ended; RuntimeError after `timeout_s`."""
    cancel(job)
    deadline = time.monotonic() + timeout_s
    while not ended(job):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{job.scheduler} job {job.id} ({job.name}) was cancelled but has not ended "
                               f"after {timeout_s:.0f} s")
        time.sleep(POLL_S)


def stop_recorded(step_dir: str | Path) -> JobRecord | None:
    """Cancel the job recorded in `step_dir` (a dead holder's), wait until it ended, forget it; the job, or None."""
    job = recorded(step_dir)
    if job is None:
        return None
    cancel_and_wait(job)
    forget(step_dir, job)
    return job
