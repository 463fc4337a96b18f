"""The side environments' interpreters, for the fixtures that hand them to tests (tests/conftest.py's
`vllm_python`, tests/engines/conftest.py's `megatron_python` and `gym_python`): each built by dev.py
from its pins, found where dev.py puts it or where an environment variable says."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def side_python(what: str, venv: str, override: str, stamp: str, key: str, pins: str, command: str) -> Path:
    """A side environment's interpreter ($override, else <venv>/bin/python), checked to be the one dev.py's
    pins build (its stamp holds their hash). Missing or stale: a failure on CI (these tests must run
    there), a skip elsewhere."""
    given = os.environ.get(override)
    python = Path(given) if given else ROOT / venv / "bin" / "python"
    problem = None
    if not python.exists():
        problem = f"no {what} side environment at {python}"
    elif not given:
        spec = importlib.util.spec_from_file_location("stagewise_dev", ROOT / "dev.py")
        dev = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(dev)
        path = getattr(dev, stamp)
        if not path.is_file() or path.read_text() != getattr(dev, key)():
            problem = f"{python.parents[1]} was not built from dev.py's {pins} (or its build did not finish)"
    if problem:
        how = f"`python3 dev.py {command}` builds it"
        if on_ci():
            pytest.fail(f"{problem}; {how} (CI is set: these tests must run, never skip)", pytrace=False)
        pytest.skip(f"{problem}; {how}")
    return python
