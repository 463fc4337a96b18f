"""The linter is part of the test command: `ruff check .` with pyproject.toml's rules is clean.

The rules (pyproject.toml, [tool.ruff]): pyflakes, pycodestyle's errors, import order, and imports
at module top (an import inside a function carries its reason in a `noqa` comment). Run from the
repository root, as a person would; CI runs it through `dev.py test`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _ruff(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_ruff_check_is_clean_on_the_tree():
    result = _ruff(".")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_ruff_with_our_rules_fails_on_unsorted_and_function_level_imports(tmp_path):
    """The same configuration finds what it is there to find (so the clean run above means something)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\n\n\ndef f():\n    import json\n\n    return json, os, sys\n")
    result = _ruff("--config", str(REPO / "pyproject.toml"), "--output-format", "concise", str(bad), cwd=tmp_path)
    assert result.returncode == 1
    assert "I001" in result.stdout and "PLC0415" in result.stdout, result.stdout
