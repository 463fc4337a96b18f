"""A launched engine as a Prefect task: output streamed line by line, the log kept, the exit status honoured."""

from __future__ import annotations

import logging
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stagewise.engines.launch.task import LaunchFailed, launch_task, stream_process


class FakeTracker:
    def __init__(self):
        self.artifacts = []

    def log_artifact(self, run_id, path, artifact_dir=None):
        self.artifacts.append((Path(path).read_text(), artifact_dir))


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "engine.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_lines_reach_the_logger_as_they_come_and_the_log_is_kept(tmp_path, caplog):
    argv = _script(tmp_path, """
        import os, sys, time
        print("iteration 1 | loss 9.5", flush=True)
        print("warning on stderr", file=sys.stderr, flush=True)
        time.sleep(0.3)
        print("run id", os.environ["MLFLOW_RUN_ID"], flush=True)
    """)
    tracker = FakeTracker()
    with caplog.at_level(logging.INFO, logger="stagewise"):
        launch_task.fn("megatron-train", argv, str(tmp_path), {"MLFLOW_RUN_ID": "abc"}, str(tmp_path / "logs" / "t.log"),
                       tracker, "run")
    lines = [r.getMessage() for r in caplog.records]
    assert "megatron-train | iteration 1 | loss 9.5" in lines and "megatron-train | run id abc" in lines
    assert "megatron-train | warning on stderr" in lines  # stderr merged in
    log, where = tracker.artifacts[0]
    assert log.splitlines() == ["iteration 1 | loss 9.5", "warning on stderr", "run id abc"] and where == "launch"


def test_a_line_is_logged_before_the_process_ends(tmp_path):
    argv = _script(tmp_path, """
        import time
        print("first", flush=True)
        time.sleep(1.5)
    """)
    seen = []

    class Spy(logging.Handler):
        def emit(self, record):
            seen.append((record.getMessage(), time.monotonic()))

    handler = Spy()
    logging.getLogger("stagewise").addHandler(handler)
    logging.getLogger("stagewise").setLevel(logging.INFO)
    try:
        start = time.monotonic()
        code, _ = stream_process("e", argv, tmp_path, {}, tmp_path / "e.log")
        end = time.monotonic()
    finally:
        logging.getLogger("stagewise").removeHandler(handler)
    first = next(t for m, t in seen if m == "e | first")
    assert code == 0 and first - start < (end - start) - 1.0  # streamed, not collected at exit


def test_a_failing_launch_raises_with_its_status_and_last_lines_and_still_logs(tmp_path):
    argv = _script(tmp_path, """
        import sys
        for i in range(100):
            print(f"step {i}")
        print("CUDA out of memory", file=sys.stderr)
        sys.exit(3)
    """)
    tracker = FakeTracker()
    with pytest.raises(LaunchFailed) as err:
        launch_task.fn("megatron-train", argv, str(tmp_path), {}, str(tmp_path / "t.log"), tracker, "run")
    assert err.value.returncode == 3
    assert "status 3" in str(err.value) and "CUDA out of memory" in str(err.value) and "step 99" in str(err.value)
    assert "step 0\n" not in str(err.value)  # only the tail is quoted
    assert tracker.artifacts and "step 0" in tracker.artifacts[0][0]  # the whole log is kept


def test_an_interrupted_launch_kills_its_whole_process_group(tmp_path):
    import os
    import signal

    argv = _script(tmp_path, f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(tmp_path / 'child.pid')!r}, "w").write(str(child.pid))
        print("ready", flush=True)
        time.sleep(60)
    """)

    class Interrupt(logging.Handler):
        def emit(self, record):
            if record.getMessage().endswith("| ready"):
                raise KeyboardInterrupt

    handler = Interrupt()
    log = logging.getLogger("stagewise")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.raiseExceptions = True
    try:
        with pytest.raises(KeyboardInterrupt):
            stream_process("e", argv, tmp_path, {}, tmp_path / "e.log")
    finally:
        log.removeHandler(handler)
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the engine's child process outlived the interrupted launch")


def test_an_interrupted_kubernetes_launch_deletes_its_job(tmp_path, monkeypatch):
    """The plan's command streams the Job; interrupted, the task deletes the Job (with its pods) through a
    stand-in kubectl on PATH, and waits until `get job` finds none, before the interruption goes on."""
    from stagewise.engines.launch.plans import ScheduledJob
    from stagewise.store.jobs import recorded

    calls = tmp_path / "kubectl.calls"
    kubectl = tmp_path / "bin" / "kubectl"
    kubectl.parent.mkdir()
    kubectl.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {calls}\n")  # `get job`: prints nothing, so no Job is left
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{kubectl.parent}:{os.environ['PATH']}")
    argv = _script(tmp_path, """
        import time
        print("ready", flush=True)
        time.sleep(60)
    """)

    class Interrupt(logging.Handler):
        def emit(self, record):
            if record.getMessage().endswith("| ready"):
                assert recorded(tmp_path / "step") is not None  # recorded while it runs
                raise KeyboardInterrupt

    handler = Interrupt()
    log = logging.getLogger("stagewise")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    (tmp_path / "step").mkdir()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch_task.fn("grpo", argv, str(tmp_path), {}, str(tmp_path / "k.log"), FakeTracker(), "run",
                           job=ScheduledJob("kubernetes", "grpo-0123", id="team/grpo-0123"), step_dir=str(tmp_path / "step"))
    finally:
        log.removeHandler(handler)
    lines = calls.read_text().splitlines()
    assert lines[0] == "-n team delete job grpo-0123 --ignore-not-found --wait=true --cascade=foreground"
    assert lines[1] == "-n team get job grpo-0123 --ignore-not-found -o name"
    assert recorded(tmp_path / "step") is None
