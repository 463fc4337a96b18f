"""End to end: two `stagewise run` processes on one workdir, and a run SIGKILLed while it holds a step.

Against one real `prefect server` (as on a shared server; each CLI run would otherwise start its own):

- two runs of one recipe started together on one workdir both exit 0: one builds the pretraining step,
  the other says it waits for it and then reuses it; the weights they hand on are the same file;
- a run SIGKILLed after its first checkpoint leaves its lease behind; a rerun without --resume waits
  for the lease to expire (no heartbeat), takes it over and stops naming the interrupted directory;
  with --resume it continues, and its weights are bit for bit those of the run that trained alone.

The pretraining is the smallest that checkpoints midway (8 steps of 1,024 tokens on a small world).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stagewise.model.checkpoint import read_meta
from tests.e2e.servers import prefect_server

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny.yaml"
SMALL = ["stages.pretrain.tokens=8192", "stages.pretrain.global_batch=4", "stages.pretrain.micro_batch=4",
         "stages.pretrain.checkpoint_every_tokens=4096", "stages.pretrain.schedule.warmup_tokens=1024",
         "stages.pretrain.val_tokens=2048", "tokenizer.vocab_size=1024", "data.world.stdlib_files=20",
         "data.world.facts=600", "data.world.arithmetic=400", "data.world.retrieval=30", "data.world.noisy=100"]
TTL_S = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("prefect-home")) as started:
        yield started


def _start(server, workdir: Path, *extra: str) -> subprocess.Popen:
    args = [a for v in [f"workdir={workdir}", *SMALL] for a in ("--set", v)]
    env = dict(server[1], CI="1", STAGEWISE_LEASE_TTL_S=str(TTL_S))
    return subprocess.Popen([sys.executable, "-m", "stagewise.cli", "run", str(TINY), "--stages", "pretrain", *args,
                             "--json", *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, dict | None, str]:
    """(exit code, the --json document: the summary, or {"ok": false, "error": ...} on a failure, stderr)."""
    out, err = proc.communicate(timeout=timeout)
    document = json.loads(out[out.index("{"):]) if "{" in out else None
    return proc.returncode, document, err


def _handed_on(summary: dict) -> Path:
    (result,) = summary["stages"]
    return Path(result["checkpoint"])


@pytest.mark.slow
def test_two_runs_on_one_workdir_build_each_step_once_and_a_killed_holder_is_taken_over(server, tmp_path):
    shared = tmp_path / "shared"
    first, second = _start(server, shared), _start(server, shared)
    (rc1, one, err1), (rc2, two, err2) = _finish(first), _finish(second)
    assert rc1 == 0 and rc2 == 0, err1[-3000:] + err2[-3000:]
    assert _handed_on(one) == _handed_on(two)  # one step directory, one checkpoint
    reused = [s["stages"][0].get("reused", False) for s in (one, two)]
    assert sorted(reused) == [False, True], reused  # one trained, the other reused what it trained
    waited = err2 if reused[1] else err1
    assert "waiting for run" in waited and "which is building" in waited
    alone = read_meta(_handed_on(one)).weight_sha256
    step = _handed_on(one).parent
    assert not (step / ".lease").exists()

    killed_dir = tmp_path / "killed"
    victim = _start(server, killed_dir)
    deadline = time.monotonic() + 900
    while not list(killed_dir.glob("stages/pretrain-*/step-00000004/stagewise.json")):
        assert victim.poll() is None and time.monotonic() < deadline, victim.communicate()[1][-3000:]
        time.sleep(0.5)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(30)
    (interrupted,) = killed_dir.glob("stages/pretrain-*")
    assert (interrupted / ".lease").exists() and not (interrupted / "finished.json").exists()

    rc, failed, err = _finish(_start(server, killed_dir))
    assert rc == 1 and "stopped building" in err and "takes the step over" in err, err[-3000:]
    assert failed is not None and failed["ok"] is False, (failed, err[-3000:])  # --json: the error is the document
    assert f"{interrupted} holds an interrupted run" in failed["error"] and "pass --resume" in failed["error"]
    assert "Traceback" not in err  # Prefect's exception records went to the run's log file
    rc, resumed, err = _finish(_start(server, killed_dir, "--resume"))
    assert rc == 0, err[-3000:]
    assert read_meta(_handed_on(resumed)).weight_sha256 == alone  # as if never interrupted, nor shared
    assert not (interrupted / ".lease").exists()
