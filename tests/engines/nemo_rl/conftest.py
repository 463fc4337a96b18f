"""Fixtures of the NeMo RL tests: the side environment with the released NeMo Gym.

Tests marked `megatron` (the project's marker for side-environment tests) run code in `.venv-gym`
(built by `python3 dev.py gym-env`) as subprocesses, `[gym_python, script, args...]`, with the
scripts of side_env/; nothing here imports nemo_gym. As tests/engines/megatron/conftest.py does for
its own, they are left out by default (pyproject.toml's addopts) and count as `slow` too.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PYTHON = ROOT / ".venv-gym" / "bin" / "python"
OVERRIDE = "STAGEWISE_GYM_PYTHON"


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
    stamp = dev.GYM_STAMP
    if not stamp.is_file() or stamp.read_text() != dev.gym_pins_key():
        return f"{python.parents[1]} was not built from dev.py's GYM_PINS (or its build did not finish)"
    return None


@pytest.fixture(scope="session")
def gym_python() -> Path:
    """The NeMo Gym side environment's interpreter ($STAGEWISE_GYM_PYTHON, else .venv-gym/bin/python).
    Missing or stale: a failure on CI (these tests must run there), a skip elsewhere."""
    given = os.environ.get(OVERRIDE)
    python = Path(given) if given else DEFAULT_PYTHON
    if not python.exists():
        problem = f"no NeMo Gym side environment at {python}"
    else:
        problem = None if given else _stale(python)
    if problem:
        how = "`python3 dev.py gym-env` builds it"
        if _on_ci():
            pytest.fail(f"{problem}; {how} (CI is set: these tests must run, never skip)", pytrace=False)
        pytest.skip(f"{problem}; {how}")
    return python
