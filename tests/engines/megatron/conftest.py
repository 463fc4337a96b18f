"""Fixtures of the Megatron-Bridge tests: the side environment with the released library.

Tests marked `megatron` run code in `.venv-megatron` (built by `python3 dev.py megatron-env`) as
subprocesses, `[megatron_python, script, args...]`, with the scripts of side_env/; nothing here
imports megatron. They are left out by default (pyproject.toml's addopts) and count as `slow` too,
so `-m "not slow"` leaves them out as well; `-m megatron` selects them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PYTHON = ROOT / ".venv-megatron" / "bin" / "python"
OVERRIDE = "STAGEWISE_MEGATRON_PYTHON"


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("megatron") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def _on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _stale(python: Path) -> str | None:
    """Why the default side environment is not the one dev.py's pins build (None when it is)."""
    spec = importlib.util.spec_from_file_location("stagewise_dev", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    stamp = dev.MEGATRON_STAMP
    if not stamp.is_file() or stamp.read_text() != dev.megatron_pins_key():
        return f"{python.parents[1]} was not built from dev.py's MEGATRON_PINS (or its build did not finish)"
    return None


@pytest.fixture(scope="session")
def megatron_python() -> Path:
    """The side environment's interpreter ($STAGEWISE_MEGATRON_PYTHON, else .venv-megatron/bin/python).
    Missing or stale: a failure on CI (these tests must run there), a skip elsewhere."""
    given = os.environ.get(OVERRIDE)
    python = Path(given) if given else DEFAULT_PYTHON
    if not python.exists():
        problem = f"no Megatron-Bridge side environment at {python}"
    else:
        problem = None if given else _stale(python)
    if problem:
        how = "`python3 dev.py megatron-env` builds it"
        if _on_ci():
            pytest.fail(f"{problem}; {how} (CI is set: these tests must run, never skip)", pytrace=False)
        pytest.skip(f"{problem}; {how}")
    return python
