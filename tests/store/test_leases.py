"""Step leases (store/leases.py) between real processes: one claimant builds, the other waits and then
finds the step finished; a SIGKILLed holder's lease expires by heartbeat and is taken over; a live
holder's heartbeat keeps its lease past the TTL; a stage run's leases end with it.
Two `stagewise run` processes on one workdir: tests/e2e/test_concurrent_runs.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stagewise.store.leases import LEASE, claim, held, release, releasing_new, try_acquire
from stagewise.store.steps import claim_step, finished, mark_finished

CLAIMANT = textwrap.dedent("""\
    import json, sys, time
    from pathlib import Path
    from stagewise.store.leases import claim, release
    step, name, build_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    marker = step / "finished.json"
    t0 = time.time()
    builds = claim(step, name, lambda d: (d / "finished.json").exists()) is not None
    print(json.dumps({"event": "claimed", "name": name, "builds": builds, "t": time.time() - t0}), flush=True)
    if builds:
        (step / "built-by").write_text(name)
        time.sleep(build_s)
        marker.write_text(json.dumps({"by": name}))
        release(step)
    print(json.dumps({"event": "done", "name": name, "record": json.loads(marker.read_text())}), flush=True)
    """)
"""A process claiming one step with the lease alone (no Prefect: quick to start), as claim_step does."""


def _claimant(step: Path, name: str, build_s: float, ttl: float = 30.0) -> subprocess.Popen:
    env = dict(os.environ, STAGEWISE_LEASE_TTL_S=str(ttl), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", CLAIMANT, str(step), name, str(build_s)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _events(proc: subprocess.Popen, timeout: float = 120) -> list[dict]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_one_of_two_processes_builds_the_other_waits_then_finds_it_finished(tmp_path):
    step = tmp_path / "stages" / "pretrain-0123456789abcdef"
    first = _claimant(step, "first", build_s=4)
    deadline = time.monotonic() + 60
    while not (step / "built-by").exists():  # the first holds the lease and is building
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    second = _claimant(step, "second", build_s=0)
    a, b = _events(first), _events(second)
    assert a[0]["builds"] is True and b[0]["builds"] is False
    assert b[0]["t"] > 1.0  # it waited for the build, not just looked
    assert a[1]["record"] == b[1]["record"] == {"by": "first"} and (step / "built-by").read_text() == "first"
    assert not (step / LEASE).exists()  # released with the finish marker


def test_a_sigkilled_holders_lease_is_taken_over_at_once_here_and_by_heartbeat_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("STAGEWISE_LEASE_TTL_S", "2")
    step = tmp_path / "stages" / "sft-stage1-0123456789abcdef"
    holder = _claimant(step, "dies", build_s=600, ttl=2)
    deadline = time.monotonic() + 60
    while not (step / "built-by").exists():
        assert holder.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait(10)
    dead = json.loads((step / LEASE).read_text())
    # its process is gone from this host: the lease is taken over without waiting for the TTL
    taken: list[dict] = []
    started = time.monotonic()
    mine = claim(step, "heir", lambda d: finished(d) is not None, on_takeover=lambda d, h: taken.append(h))
    assert mine is not None and taken == [dead] and time.monotonic() - started < 1.0
    assert json.loads((step / LEASE).read_text())["run"] == "heir" and step.resolve() in held()
    mark_finished(step, {"by": "heir"})
    assert step.resolve() not in held() and not (step / LEASE).exists()

    # a holder on another node: only its heartbeat tells, so the lease stands until the TTL has passed
    other = tmp_path / "stages" / "pretrain-0123456789abcdef"
    other.mkdir(parents=True)
    remote = {"id": "remote", "run": "r", "pid": 1, "host": "gpu-node-7"}
    (other / LEASE).write_text(json.dumps(remote))
    lease, live = try_acquire(other, "too-soon")
    assert lease is None and live == remote
    started = time.monotonic()
    mine = claim(other, "heir", lambda d: finished(d) is not None, on_takeover=lambda d, h: taken.append(h))
    assert mine is not None and taken[-1] == remote and time.monotonic() - started >= 1.0
    release(other)


def test_a_live_holders_heartbeat_keeps_its_lease_past_the_ttl(tmp_path, monkeypatch):
    monkeypatch.setenv("STAGEWISE_LEASE_TTL_S", "1")
    step = tmp_path / "pretrain-0123456789abcdef"
    lease, _ = try_acquire(step, "alive")
    try:
        time.sleep(2.5)  # beyond the TTL: only the heartbeat keeps it
        other, holder = try_acquire(step, "other")
        assert other is None and holder["run"] == "alive" and not lease.lost
    finally:
        lease.release()
    assert not (step / LEASE).exists()


def test_a_stage_runs_leases_end_with_it_even_when_it_fails(tmp_path):
    step = tmp_path / "pretrain-0123456789abcdef"
    with pytest.raises(RuntimeError), releasing_new():
        assert claim_step("pretrain", step, "run-1") is True
        assert (step / LEASE).exists()
        raise RuntimeError("training failed")
    assert not (step / LEASE).exists() and step.resolve() not in held()
    mark_finished(step, {"by": "someone"})
    assert claim_step("pretrain", step, "run-2") is False  # finished: nothing to claim
