"""A launch that is a scheduler's job, followed to its end: never outliving its run, never passing for success.

What a real Slurm does that `sbatch --wait` hides (docs/DEPLOY.md, "Running on a Slurm cluster"):
a job cancelled while pending ends CANCELLED with exit code 0:0 and `sbatch --wait` exits 0; killing
`sbatch --wait` leaves the job running; a request the partition can never meet may wait forever. So
a Slurm launch here is

1. checked with `sbatch --test-only` (a request the cluster cannot satisfy is refused at once, in
   Slurm's words);
2. submitted with `sbatch --parsable`, and its job id recorded in the step directory at once
   (store/jobs.py: a run taking over a dead holder's lease cancels it);
3. followed: its output file streamed line by line as it grows, its state read from `scontrol show
   job` every POLL_S; pending for a reason that never clears (NEVER_CLEARS) or longer than
   `launch.slurm.max_pending`, it is cancelled and the launch fails naming the reason;
4. decided by the scheduler's word: COMPLETED is success, any other end (CANCELLED, TIMEOUT,
   NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, FAILED, ...) fails naming it, whatever an exit code says.
   When Slurm has already forgotten the job (MinJobAge after its end, and there may be no `sacct`),
   the marker file its script writes as it ends decides; no marker is an unknown end, a failure;
5. cancelled on any interruption of the follower (Ctrl-C, SIGTERM, a cancelled Prefect flow run:
   BaseException), waiting until Slurm says it ended, before the interruption goes on.

A Kubernetes Job is applied and streamed by the plan's own command; here it is only recorded and, on
an interruption, deleted with its pods.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from stagewise.engines.launch.plans import ScheduledJob
from stagewise.store.jobs import JobRecord, SlurmState, cancel_and_wait, forget, record, slurm_state

POLL_S = 2.0
"""How often the job's state is read and its output file looked at."""
UNREADABLE_S = 600.0
"""How long `scontrol` may fail in a row (a controller restarting, a network blip) before the job is
given up as unknown: a long training job is not lost to one failed poll."""
NEVER_CLEARS = ("PartitionConfig", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS",
                "AccountNotAllowed", "QOSNotAllowed")
"""Pending reasons a job never leaves without a change to the cluster: the request does not fit the
partition (nodes, time), names a feature, account or QOS it cannot have. (Waiting reasons such as
Resources, Priority or a down node's PartitionNodeLimit can clear: max_pending bounds those.)"""


class JobFailed(RuntimeError):
    """A scheduler's job did not complete (or could not be submitted); the message names its state."""

    def __init__(self, name: str, message: str, log_path: Path | None = None, tail: list[str] | None = None):
        self.log_path = log_path
        text = f"{name}: {message}" + (f" (log: {log_path})" if log_path else "")
        super().__init__(text + (("; its last lines:\n" + "\n".join(tail)) if tail else ""))


class _Tail:
    """New lines of a file that another process appends to (the job's output on the shared filesystem)."""

    def __init__(self, path: Path):
        self.path, self.pos, self.partial = path, 0, ""

    def lines(self) -> list[str]:
        try:
            with self.path.open("r", encoding="utf-8", errors="replace") as f:
                f.seek(self.pos)
                text = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return []
        text, self.partial = self.partial + text, ""
        parts = text.split("\n")
        self.partial = parts.pop()
        return parts

    def rest(self) -> list[str]:
        lines = self.lines()
        if self.partial:
            lines, self.partial = [*lines, self.partial], ""
        return lines


def run_slurm_job(job: ScheduledJob, argv: list[str], cwd: str, env: dict[str, str], step_dir: Path,
                  on_line: Callable[[str], None], max_pending_s: float | None = None,
                  poll_s: float = POLL_S) -> None:
    """Submit `argv` (sbatch --parsable ...) and follow its job to its end (module docstring); JobFailed
    unless it COMPLETED. `on_line` gets each line of the job's output as it is written."""
    assert job.scheduler == "slurm" and job.script and job.log and job.marker
    refusal = subprocess.run(["sbatch", "--test-only", job.script], cwd=cwd, env=env, capture_output=True, text=True)
    if refusal.returncode != 0:
        raise JobFailed(job.name, "Slurm refuses the request: " + _words(refusal))
    Path(job.marker).unlink(missing_ok=True)  # an earlier attempt's
    submitted = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if submitted.returncode != 0:
        raise JobFailed(job.name, f"sbatch exited {submitted.returncode}: " + _words(submitted))
    job_id = submitted.stdout.strip().split(";")[0]
    rec = JobRecord("slurm", job_id, job.name, job.marker)
    record(step_dir, rec)
    on_line(f"submitted as Slurm job {job_id}")
    tail = _Tail(Path(job.log))
    try:
        last = _follow(job, job_id, tail, on_line, max_pending_s, poll_s)
    except BaseException:
        on_line(f"interrupted: cancelling Slurm job {job_id}")
        cancel_and_wait(rec)
        forget(step_dir, rec)
        raise
    for line in tail.rest():
        on_line(line)
    forget(step_dir, rec)
    _decide(job, job_id, last)


def _follow(job: ScheduledJob, job_id: str, tail: _Tail, on_line: Callable[[str], None],
            max_pending_s: float | None, poll_s: float) -> SlurmState | None:
    """Stream the output until the job ends or Slurm forgets it; its last state seen (None: forgotten)."""
    pending_since = time.monotonic()
    said, unreadable_since = None, None
    while True:
        for line in tail.lines():
            on_line(line)
        try:
            state = slurm_state(job_id)
        except RuntimeError as e:  # scontrol itself failed: keep following, up to UNREADABLE_S
            unreadable_since = unreadable_since or time.monotonic()
            if time.monotonic() - unreadable_since > UNREADABLE_S:
                raise JobFailed(job.name, f"Slurm job {job_id}: its state could not be read for "
                                          f"{UNREADABLE_S:.0f} s ({e})") from None
            time.sleep(poll_s)
            continue
        unreadable_since = None
        if state is None or state.ended:
            return state
        shown = (state.state, state.reason if state.state == "PENDING" else None)
        if shown != said:  # each change once: pending (and why), running
            on_line(f"Slurm job {job_id} is {state.state.lower()}" + (f" ({state.reason})" if shown[1] else ""))
            said = shown
        if state.state == "PENDING":
            waited = time.monotonic() - pending_since
            if state.reason in NEVER_CLEARS or (max_pending_s is not None and waited > max_pending_s):
                why = ("a request the cluster can never satisfy" if state.reason in NEVER_CLEARS
                       else f"pending longer than launch.slurm.max_pending ({max_pending_s:.0f} s)")
                cancel_and_wait(JobRecord("slurm", job_id, job.name))
                raise JobFailed(job.name, f"Slurm job {job_id} cancelled: {why}; pending reason {state.reason}")
        else:
            pending_since = time.monotonic()  # requeued jobs pend again from zero
        time.sleep(poll_s)


def _decide(job: ScheduledJob, job_id: str, last: SlurmState | None) -> None:
    """Success only for COMPLETED (or, the record gone, a marker holding 0); JobFailed otherwise."""
    log = Path(job.log) if job.log else None
    if last is not None:
        if last.state == "COMPLETED":
            return
        raise JobFailed(job.name, f"Slurm job {job_id} ended {last.state} (reason {last.reason}, exit code "
                                  f"{last.exit_code})", log, _last_lines(log))
    try:
        status = Path(job.marker).read_text().strip() if job.marker else None
    except FileNotFoundError:
        status = None
    if status == "0":
        return
    if status is None:
        raise JobFailed(job.name, f"Slurm job {job_id} ended with no record left and no completion marker "
                                  f"(an unknown end: killed before its script could say)", log, _last_lines(log))
    raise JobFailed(job.name, f"Slurm job {job_id} exited with status {status}", log, _last_lines(log))


def _words(proc: subprocess.CompletedProcess) -> str:
    text = " ".join((proc.stderr or proc.stdout or "").split())
    return text.removeprefix("sbatch: error: ") or "(no message)"


def _last_lines(log: Path | None, n: int = 20) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()[-n:] if log else []
    except FileNotFoundError:
        return []
