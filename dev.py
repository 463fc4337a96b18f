#!/usr/bin/env python3
"""Set up and run stagewise on a fresh machine that has only Python 3.11.

    python3 dev.py demo    # create .venv if missing, install, run the CPU demo pipeline
    python3 dev.py test    # create .venv if missing, install, run the whole test suite

The virtualenv is (re)installed only when pyproject.toml changed since the last install.
torch is pinned to the CPU build (2.13.0) through the `dev` extra, so no CUDA wheels are
pulled. Extra arguments go to the command: `python3 dev.py test -k recipe -x`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".stagewise-install"


def _install_key() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_venv() -> None:
    """Create .venv and install the project with its dev extra when needed."""
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if STAMP.exists() and STAMP.read_text() == _install_key():
        return
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["-e", f"{ROOT}[dev]"], check=True, cwd=ROOT)
    STAMP.write_text(_install_key())


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test"):
        print(__doc__)
        return 2
    ensure_venv()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if argv[0] == "demo":
        cmd = [str(BIN / "stagewise"), "demo", *argv[1:]]
    else:
        cmd = [str(BIN / "python"), "-m", "pytest", "-q", *argv[1:]]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
