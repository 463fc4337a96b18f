"""The real servers end-to-end tests start on 127.0.0.1, and how their processes are stopped and read."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, grace: float = 30) -> None:
    """SIGTERM (serve pauses its deployments), then SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@contextlib.contextmanager
def prefect_server(home: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`prefect server start` on a free port with its own PREFECT_HOME, the UI served too:
    (api url, environment for its clients), until the block ends."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_API_URL=url, PREFECT_SERVER_ANALYTICS_ENABLED="false", CI="1",
               PREFECT_UI_ENABLED="true", PREFECT_UI_API_URL=url)
    log = home / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                                 "--analytics-off"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=home)
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "prefect server did not start:\n" + tail(log)
            time.sleep(1)
        yield url, env
    finally:
        stop(proc)
