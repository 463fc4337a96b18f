"""Launches on a real Slurm (tests/slurm_cluster.py: munge, slurmctld and two slurmd daemons started here).

What the stand-in sbatch/srun scripts could never show, each checked against the real scheduler:
- a job's output reaches the task's log line by line while it runs, and COMPLETED is success;
- a failing entry fails the launch naming FAILED and its exit code;
- a job cancelled while pending (a person, a preemption) fails the launch naming CANCELLED, where
  `sbatch --wait` exits 0;
- an interrupted launch cancels its job and returns only once Slurm says it ended;
- a run taking over a dead holder's lease cancels the job that holder recorded before anything else;
- a request the partition can never meet is refused within seconds, in Slurm's words, and a job
  pending past `launch.slurm.max_pending` is cancelled naming its reason;
- torchrun across the two slurmd daemons: two ranks meet at the rendezvous and give one result.
The entries run in this project's own venv (`launch.env.venv`), CPU only; the GPUs are fake GRES.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from stagewise.engines.config import LaunchConfig
from stagewise.engines.launch.plans import plan_launch
from stagewise.engines.launch.scheduler_job import JobFailed
from stagewise.engines.launch.task import launch_task
from stagewise.store.jobs import JobRecord, record, recorded, slurm_state

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]
VENV = str(Path(sys.executable).parents[1])


class FakeTracker:
    def __init__(self):
        self.artifacts = []

    def log_artifact(self, run_id, path, artifact_dir=None):
        self.artifacts.append((Path(path).read_text(), artifact_dir))


def launch(**kw) -> LaunchConfig:
    return LaunchConfig.model_validate({"env": {"venv": VENV}, "scheduler": "slurm", "gpus_per_node": 1,
                                        "slurm": {"time": "10:00"}, **kw})


def entry(tmp_path: Path, body: str, name: str = "entry.py") -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return ["python", str(path)]


def start(cfg: LaunchConfig, argv: list[str], step: Path, name: str = "train", style: str = "single",
          tracker: FakeTracker | None = None, max_pending_s: float | None = None) -> None:
    """launch_task (its body, no Prefect run) for `argv` planned by `cfg` in the step directory `step`."""
    step.mkdir(parents=True, exist_ok=True)
    plan = plan_launch(cfg, argv, step, style=style, name=name, env={"MLFLOW_RUN_ID": "r1"})
    plan.write_files()
    launch_task.fn(name, plan.argv, plan.cwd, plan.env, str(step / "launch" / f"{name}.log"), tracker or FakeTracker(),
                   "r1", job=plan.job, step_dir=str(step), max_pending_s=max_pending_s)


def blocker(cluster, nodes: int = 2) -> str:
    """A job holding every node (exclusive) until cancelled: what keeps the next one pending."""
    out = cluster.run("sbatch", "--parsable", "--exclusive", f"--nodes={nodes}", "--output=/dev/null",
                      "--wrap", "sleep 300").stdout.strip()
    deadline = time.monotonic() + 30
    while slurm_state(out).state != "RUNNING":
        assert time.monotonic() < deadline, "the blocker never started"
        time.sleep(0.3)
    return out


def no_jobs_left(cluster, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while cluster.jobs():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_a_job_streams_its_lines_and_completes(slurm, tmp_path, caplog):
    argv = entry(tmp_path, """
        import os, time
        print("iteration 1 | loss 9.5", flush=True)
        time.sleep(1)
        print("job", os.environ["SLURM_JOB_ID"], "run", os.environ["MLFLOW_RUN_ID"], flush=True)
    """)
    tracker, step = FakeTracker(), tmp_path / "step"
    with caplog.at_level(logging.INFO, logger="stagewise"):
        start(launch(), argv, step, tracker=tracker)
    lines = [r.getMessage() for r in caplog.records]
    assert "train | iteration 1 | loss 9.5" in lines
    submitted = next(m for m in lines if m.startswith("train | submitted as Slurm job "))
    job_id = submitted.rsplit(" ", 1)[1]
    assert f"train | job {job_id} run r1" in lines
    assert (step / "launch" / "train.exit").read_text() == "0\n"  # the script's own word on its end
    assert recorded(step) is None  # the record goes with the job
    log, where = tracker.artifacts[0]
    assert "iteration 1 | loss 9.5" in log and where == "launch"


def test_a_failing_entry_fails_naming_the_state_and_its_code(slurm, tmp_path):
    argv = entry(tmp_path, """
        import sys
        print("CUDA out of memory", flush=True)
        sys.exit(7)
    """)
    with pytest.raises(JobFailed, match=r"train: Slurm job \d+ ended FAILED \(reason NonZeroExitCode, exit code 7:0\)"
                                        r"[\s\S]*CUDA out of memory"):
        start(launch(), argv, tmp_path / "step")


def test_a_job_cancelled_while_pending_fails_naming_cancelled(slurm, tmp_path):
    """`sbatch --wait` exits 0 for it; here the launch fails naming CANCELLED."""
    hold = blocker(slurm)
    step, failure = tmp_path / "step", []
    argv = entry(tmp_path, "print('never runs')\n")

    def run() -> None:
        try:
            start(launch(), argv, step)
        except JobFailed as e:
            failure.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while (rec := recorded(step)) is None or slurm_state(rec.id).state != "PENDING":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        slurm.run("scancel", rec.id)  # a person, a preemption, an administrator
        thread.join(60)
    finally:
        slurm.run("scancel", hold)
    assert not thread.is_alive() and failure, "the launch did not end"
    assert f"Slurm job {rec.id} ended CANCELLED" in str(failure[0])
    assert "never runs" not in (step / "launch" / "train.log").read_text()


def test_an_interrupted_launch_cancels_its_job_before_it_returns(slurm, tmp_path):
    argv = entry(tmp_path, """
        import time
        print("started", flush=True)
        time.sleep(300)
    """)

    class Interrupt(logging.Handler):
        def emit(self, record):
            if record.getMessage() == "train | started":
                raise KeyboardInterrupt

    handler = Interrupt()
    logging.getLogger("stagewise").addHandler(handler)
    logging.getLogger("stagewise").setLevel(logging.INFO)
    step = tmp_path / "step"
    try:
        with pytest.raises(KeyboardInterrupt):
            start(launch(), argv, step)
    finally:
        logging.getLogger("stagewise").removeHandler(handler)
    assert slurm.jobs() == []  # ended (cancelled) before the interruption went on
    assert recorded(step) is None


def test_taking_over_a_dead_holders_lease_cancels_its_job_first(slurm, tmp_path):
    """The holder was SIGKILLed with its job running: its lease (a dead pid here) and job record stay behind."""
    from stagewise.store.leases import LEASE, release
    from stagewise.store.steps import claim_step

    step = tmp_path / "stages" / "pretrain-abc"
    step.mkdir(parents=True)
    job_id = slurm.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300").stdout.strip()
    record(step, JobRecord("slurm", job_id, "pretrain-train"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (step / LEASE).write_text(json.dumps({"id": "x", "run": "killed", "pid": dead.pid, "host": os.uname().nodename}))
    assert claim_step("pretrain", step, "new-run") is True
    try:
        assert slurm_state(job_id) is None or slurm_state(job_id).ended  # stopped before the claim returned
        assert recorded(step) is None
    finally:
        release(step)


def test_a_request_the_cluster_cannot_meet_is_refused_at_once(slurm_one_node, tmp_path):
    """Two nodes of a one-node partition, EnforcePartLimits off: pending forever under `sbatch --wait`."""
    began = time.monotonic()
    with pytest.raises(JobFailed, match=r"train: Slurm refuses the request: .*Requested node configuration is not "
                                        r"available"):
        start(launch(nodes=2), entry(tmp_path, "print('x')\n"), tmp_path / "step")
    assert time.monotonic() - began < 60
    assert slurm_one_node.jobs() == []


def test_a_job_pending_past_max_pending_is_cancelled_naming_its_reason(slurm, tmp_path):
    hold = blocker(slurm)
    try:
        began = time.monotonic()
        with pytest.raises(JobFailed, match=r"Slurm job \d+ cancelled: pending longer than launch\.slurm\.max_pending "
                                            r"\(3 s\); pending reason (Resources|Priority|Nodes_required_for_job_are_DOWN)"):
            start(launch(), entry(tmp_path, "print('x')\n"), tmp_path / "step", max_pending_s=3)
        assert time.monotonic() - began < 30
        assert [j for j in slurm.jobs() if j[0] != hold] == []
    finally:
        slurm.run("scancel", hold)
    assert no_jobs_left(slurm)


def test_torchrun_across_two_slurmd_daemons_meets_at_one_rendezvous(slurm, tmp_path):
    """Two nodes x one rank: torchrun per node, c10d rendezvous on the first; an all-reduce over gloo."""
    out = tmp_path / "result"
    argv = entry(tmp_path, f"""
        import os, socket
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        print(f"rank {{rank}} of {{world}} on {{os.environ['SLURMD_NODENAME']}}: sum {{total.item():g}}", flush=True)
        if rank == 0:
            open({str(out)!r}, "w").write(f"{{world}} {{total.item():g}}")
        dist.destroy_process_group()
    """)
    caplog_lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            caplog_lines.append(record.getMessage())

    handler = Keep()
    logging.getLogger("stagewise").addHandler(handler)
    logging.getLogger("stagewise").setLevel(logging.INFO)
    try:
        start(launch(nodes=2), argv, tmp_path / "step", style="torchrun")
    finally:
        logging.getLogger("stagewise").removeHandler(handler)
    assert out.read_text() == "2 3"  # one result: both ranks' contributions
    ranks = sorted(line.split("| ", 1)[1] for line in caplog_lines if "rank " in line and " of 2 on " in line)
    assert [r.split(" on ")[0] for r in ranks] == ["rank 0 of 2", "rank 1 of 2"], caplog_lines
    assert {r.split(" on ")[1].split(":")[0] for r in ranks} == set(slurm.nodes)  # one rank on each node


def test_a_failed_state_read_is_retried_not_taken_for_an_end(slurm, tmp_path, monkeypatch):
    """scontrol failing for a while (a controller restarting) does not end the follow: the job completes."""
    import stagewise.engines.launch.scheduler_job as follower

    real, failures = follower.slurm_state, {"left": 3}

    def flaky(job_id):
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("slurm_load_jobs error: Unable to contact slurm controller")
        return real(job_id)

    monkeypatch.setattr(follower, "slurm_state", flaky)
    start(launch(), entry(tmp_path, "print('done', flush=True)\n"), tmp_path / "step")
    assert failures["left"] == 0 and (tmp_path / "step" / "launch" / "train.exit").read_text() == "0\n"
