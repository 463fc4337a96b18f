"""`stagewise serve` refuses to start (exit 2, one clear line) when there is nothing to serve against.

Run as a subprocess with its own PREFECT_HOME, so no profile of this machine supplies an API URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _serve(tmp_path: Path, *args: str, api_url: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "home")}
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    return subprocess.run([sys.executable, "-m", "stagewise.cli", "serve", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


@pytest.mark.parametrize("api_url, says", [
    (None, "PREFECT_API_URL is not set"),
    ("http://127.0.0.1:{port}/api", "the Prefect server does not answer"),
])
def test_serve_exits_2_without_a_server(tmp_path, api_url, says):
    proc = _serve(tmp_path, api_url=api_url and api_url.format(port=_closed_port()))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and says in proc.stderr and "Traceback" not in proc.stderr


def test_serve_checks_its_recipe_first(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: " + str(ROOT / "recipes" / "tiny.yaml") + "\nseed: many\n")
    proc = _serve(tmp_path, "--recipe", str(bad), api_url=None)
    assert proc.returncode == 2 and "seed: " in proc.stderr and "bad.yaml:2" in proc.stderr, proc.stderr


def test_serve_checks_its_cron(tmp_path):
    proc = _serve(tmp_path, "--cron", "61 3 * * 0", api_url=None)
    assert proc.returncode == 2 and "--cron '61 3 * * 0': not a cron schedule" in proc.stderr, proc.stderr


def test_serve_help_shows_the_three_commands():
    proc = subprocess.run([sys.executable, "-m", "stagewise.cli", "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for line in ("prefect server start", "stagewise serve --recipe", "--no-schedule", "http://127.0.0.1:4200"):
        assert line in proc.stdout, line
