"""A launched engine as one Prefect task: its output streamed into the task's log, its exit status honoured.

Megatron-Bridge and NeMo RL run as processes in their own environment (engines/launch/plans.py
builds the command: torchrun here, an sbatch script, a Kubernetes Job). What a user needs from the
Prefect UI is to watch that process as it runs and to see the stage fail when it fails, so:
- every line the process writes (stdout and stderr, merged, in order) goes to the task's run
  logger as it arrives, and to a log file in the stage directory;
- the log file is logged to the stage's MLflow run (`launch/<name>.log`) whether the launch
  succeeded or not;
- a non-zero exit raises `LaunchFailed` with the exit status and the last lines, so the task,
  the stage flow and `stagewise run` fail (exit 1) — never a stage that "finished" on nothing;
- if the task itself is interrupted (Ctrl-C, a cancelled flow run), the process group is killed,
  and a scheduler's job is cancelled (engines/launch/scheduler_job.py: a Slurm job is followed by
  its id, not through `sbatch --wait`, and decided by the scheduler's state), so no orphaned job
  keeps GPUs busy and no cancelled job passes for success.
The task does not retry: a training launch that died is resumed by `stagewise run --resume`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections import deque
from pathlib import Path

from prefect import task

from stagewise.engines.launch.plans import ScheduledJob
from stagewise.engines.launch.scheduler_job import run_slurm_job
from stagewise.store.jobs import JobRecord, cancel_and_wait, forget, record
from stagewise.store.policy import once, run_logger
from stagewise.store.tracking import Tracker

TAIL_LINES = 40
"""Lines of output quoted in the error of a failed launch."""


class LaunchFailed(RuntimeError):
    """A launched engine exited with a non-zero status."""

    def __init__(self, name: str, returncode: int, log_path: Path, tail: list[str]):
        self.returncode = returncode
        self.log_path = log_path
        super().__init__(f"{name} exited with status {returncode} (log: {log_path}); its last lines:\n"
                         + "\n".join(tail))


def stream_process(name: str, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> tuple[int, list[str]]:
    """Run `argv`, copying each output line to the run logger and `log_path`; its exit status and last lines.

    The child gets its own process group (start_new_session) so an interruption here can stop
    it and everything it spawned (torchrun's ranks, docker, srun)."""
    logger = run_logger()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("%s: launching %s", name, " ".join(argv))
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                                start_new_session=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                log.write(line + "\n")
                log.flush()
                tail.append(line)
                logger.info("%s | %s", name, line)
            returncode = proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
    return returncode, list(tail)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the whole group, SIGKILL after 30 s; a group already gone is fine."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@task(**once("launch-engine"))
def launch_task(name: str, argv: list[str], cwd: str, env: dict[str, str], log_path: str,
                tracker: Tracker, run_id: str, job: ScheduledJob | None = None, step_dir: str | None = None,
                max_pending_s: float | None = None) -> None:
    """Run one launched engine step (`name`: e.g. `megatron-import`, `megatron-train`); raise on failure.

    `job`: the plan's scheduler job (recorded in `step_dir`, the step's directory, while it runs);
    `max_pending_s`: how long a Slurm job may pend (launch.slurm.max_pending; None: no limit)."""
    log = Path(log_path)
    if job is not None and step_dir is None:
        raise ValueError("a scheduler's job is recorded in its step directory: give step_dir")
    try:
        if job is not None and job.scheduler == "slurm":
            _follow_job(name, job, argv, Path(cwd), env, log, Path(step_dir), max_pending_s)
            returncode, tail = 0, []
        elif job is not None:  # kubernetes: the plan streams the Job; recorded, so an interruption deletes it
            rec = JobRecord(job.scheduler, job.id or job.name, name)
            record(step_dir, rec)
            try:
                returncode, tail = stream_process(name, argv, Path(cwd), env, log)
            except BaseException:
                cancel_and_wait(rec)
                raise
            finally:
                forget(step_dir, rec)
        else:
            returncode, tail = stream_process(name, argv, Path(cwd), env, log)
    finally:
        if log.is_file():
            tracker.log_artifact(run_id, log, "launch")
    if returncode != 0:
        raise LaunchFailed(name, returncode, log, tail)
    run_logger().info("%s: finished (exit 0)", name)


def _follow_job(name: str, job: ScheduledJob, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
                step_dir: Path, max_pending_s: float | None) -> None:
    """A Slurm job submitted and followed (engines/launch/scheduler_job.py), its lines to the run logger and `log_path`."""
    logger = run_logger()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("%s: submitting %s", name, " ".join(argv))
    with log_path.open("w", encoding="utf-8") as log:
        def on_line(line: str) -> None:
            log.write(line + "\n")
            log.flush()
            logger.info("%s | %s", name, line)

        run_slurm_job(job, argv, str(cwd), {**os.environ, **env}, step_dir, on_line, max_pending_s)
