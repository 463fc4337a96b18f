"""End to end on a real Slurm (tests/slurm_cluster.py): every stage of a short tiny pipeline as a Slurm job.

- The same recipe twice, in process and with `stages.<s>.launch={scheduler: slurm, env: {venv: .venv},
  gpus_per_node: 0}` on every stage: every stage ran as a Slurm job (its log streamed into the run's,
  its record gone), and the two runs hand on the same weights, sha256 for sha256, with the same
  closing table.
- `stagewise run` SIGKILLed while its pretraining job runs, then `--resume`: squeue, polled all along,
  never shows two jobs of that stage at once (the resumed run cancels the orphaned job, waits for its
  end, then submits its own), and the weights equal an uninterrupted run's.

Runtime on a 2-core machine: ~6 minutes (each job starts Python, torch and a Prefect flow run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stagewise.model.checkpoint import read_meta
from tests.short_pipeline import SHORT

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny.yaml"
VENV = Path(sys.executable).parents[1]
STAGES = ["pretrain", "merge", "long_context", "sft", "rl", "distill", "quantize"]
ON_SLURM = f"{{scheduler: slurm, env: {{venv: {VENV}}}, gpus_per_node: 0, slurm: {{time: '30:00'}}}}"
pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.xdist_group("slurm")]


def sets(*values: str) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def start(workdir: Path, *values: str, stages: list[str] = STAGES, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stagewise.cli", "run", str(TINY), "--stages", ",".join(stages),
                             *sets(f"workdir={workdir}", *values), "--json", *extra], cwd=ROOT, env=dict(os.environ, CI="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 1500) -> dict:
    return finish_with_log(proc, timeout)[0]


def finish_with_log(proc: subprocess.Popen, timeout: float = 1500) -> tuple[dict, str]:
    """(the --json summary, stderr) of a run that must exit 0."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out[out.index("{"):]), err


def weights(checkpoint: str) -> str:
    return read_meta(checkpoint).weight_sha256


@pytest.fixture(scope="module")
def both(slurm, tmp_path_factory) -> tuple[dict, dict, Path]:
    """(in process, on Slurm, the Slurm run's workdir): the same short pipeline twice."""
    here = start(tmp_path_factory.mktemp("in-process"), *SHORT)
    there_dir = tmp_path_factory.mktemp("on-slurm")
    there = start(there_dir, *SHORT, *[f"stages.{s}.launch={ON_SLURM}" for s in STAGES])
    return finish(here), finish(there), there_dir


def test_every_stage_on_slurm_hands_on_the_same_weights_and_closing_table(both):
    here, there, workdir = both
    assert [r["stage"] for r in there["stages"]] == STAGES
    for a, b in zip(here["stages"], there["stages"]):
        assert weights(a["checkpoint"]) == weights(b["checkpoint"]), a["stage"]
        # where our engine runs is no part of a step: the same step directories, each built once per workdir
        assert Path(a["stage_dir"]).name == Path(b["stage_dir"]).name, a["stage"]
        assert (a["metric"], a["before"], a["after"], a["tokens"]) == (b["metric"], b["before"], b["after"], b["tokens"])
    for stage in STAGES:  # each ran as a Slurm job: its own log, and no job record left behind
        (job,) = (workdir / "launch").glob(f"{stage}-*")
        assert (job / "launch" / f"{stage}-job.slurm.log").read_text().strip(), stage
        assert (job / "launch" / f"{stage}-job.exit").read_text() == "0\n" and not (job / ".job").exists()
        assert json.loads((job / "result.json").read_text())["stage"] == stage


def test_a_killed_run_resumed_never_has_two_jobs_of_a_step_and_ends_with_the_same_weights(slurm, tmp_path):
    longer = [*SHORT, "stages.pretrain.tokens=49152", "stages.pretrain.checkpoint_every_tokens=2048"]
    baseline = finish(start(tmp_path / "alone", *longer, stages=["pretrain"]))
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # how many pretraining jobs Slurm has at once, all along
        while not stop.is_set():
            seen.append(sum(1 for _, name, _ in slurm.jobs() if name.startswith("pretrain-job")))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    workdir = tmp_path / "killed"
    victim = start(workdir, *longer, f"stages.pretrain.launch={ON_SLURM}", stages=["pretrain"])
    deadline = time.monotonic() + 600
    while not list(workdir.glob("stages/pretrain-*/step-00000002/stagewise.json")):
        assert victim.poll() is None and time.monotonic() < deadline, victim.communicate()[1][-3000:]
        time.sleep(0.3)
    os.killpg(victim.pid, signal.SIGKILL)  # the run dies; its job runs on under slurmd
    victim.wait(30)
    assert any(name.startswith("pretrain-job") for _, name, _ in slurm.jobs())
    resumed, err = finish_with_log(start(workdir, *longer, f"stages.pretrain.launch={ON_SLURM}", stages=["pretrain"],
                                         extra=("--resume",)))
    # the dead run's lease taken over, its job cancelled and waited for, then the step continued
    assert "takes the step over" in err and "cancelling the slurm job" in err, err[-4000:]
    stop.set()
    watcher.join(5)
    assert max(seen) == 1 and 0 in seen, seen  # one job at a time, and a moment between the two
    assert weights(resumed["stages"][0]["checkpoint"]) == weights(baseline["stages"][0]["checkpoint"])
    assert slurm.jobs() == []


def test_sigterm_of_the_run_cancels_its_job_before_it_exits(slurm, tmp_path):
    """What a cancelled flow run or a stopped worker sends: the job is cancelled and has ended by the time
    the run has exited (output to files: a temporary Prefect server the run started may outlive it)."""
    workdir = tmp_path / "terminated"
    values = [*SHORT, "stages.pretrain.tokens=49152", "stages.pretrain.checkpoint_every_tokens=2048",
              f"stages.pretrain.launch={ON_SLURM}"]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        run = subprocess.Popen([sys.executable, "-m", "stagewise.cli", "run", str(TINY), "--stages", "pretrain",
                                *sets(f"workdir={workdir}", *values)], cwd=ROOT, env=dict(os.environ, CI="1"),
                               stdout=out, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 600
        while not list(workdir.glob("stages/pretrain-*/step-00000002/stagewise.json")):
            assert run.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()[-3000:]
            time.sleep(0.3)
        assert [name for _, name, _ in slurm.jobs() if name.startswith("pretrain-job")]
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert slurm.jobs() == []  # cancelled, and ended, before the run exited
    assert "interrupted: cancelling Slurm job" in (tmp_path / "err").read_text()
    (job,) = (workdir / "launch").glob("pretrain-*")
    assert not (job / ".job").exists()
