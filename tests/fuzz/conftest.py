"""Fixtures of the fuzz suite: the CLI called in-process, and how a case's outcome is judged.

The contract under test (docs/DESIGN.md, "bad input"): whatever a user hands the CLI, it
exits 0, or 2 with an `error: ...` message; never 1, never a traceback. Calling
`stagewise.cli.main(argv)` in-process (not a subprocess per case) is what lets 1,000+ generated
cases run in CI in well under two minutes. Every test asserts how many cases it ran, and the
session prints the total (`fuzz: N generated cases`).

Tests get the helpers through the fixtures below, never `import conftest`.
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from dataclasses import dataclass

import pytest

CASES: Counter[str] = Counter()
"""Generated cases run per test (summed in the terminal summary)."""


@dataclass
class Outcome:
    code: int | str
    out: str
    err: str

    def describe(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out[-1500:]}\n--- stderr\n{self.err[-1500:]}"


def run_cli(argv: list[str]) -> Outcome:
    """`stagewise ARGV` in this process: exit code (or "crash: <type>" for an escaped exception) and output."""
    from stagewise.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: int | str = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001 - an escaped exception is exactly what we look for
            code = f"crash: {type(e).__name__}: {e}"
    return Outcome(code, out.getvalue(), err.getvalue())


def check_refused_or_ok(o: Outcome) -> None:
    """Exit 0, or 2 with a message; never 1, never an escaped exception, never a traceback."""
    text = o.out + o.err
    assert "Traceback (most recent call last)" not in text, o.describe()
    assert o.code in (0, 2), o.describe()
    if o.code == 2:  # `error: <message>` on stderr, or with --json a document with an "error"
        message = text.split('"error": ', 1)[1] if '"error": ' in text else text.split("error:", 1)[-1]
        assert ("error:" in text or '"error": ' in text) and len(message.strip()) > 5, o.describe()


@pytest.fixture
def cli():
    """(run_cli, check_refused_or_ok, CASES) for a fuzz test."""
    return run_cli, check_refused_or_ok, CASES


def pytest_terminal_summary(terminalreporter) -> None:
    if CASES:
        per_test = ", ".join(f"{k} {v}" for k, v in sorted(CASES.items()))
        terminalreporter.write_line(f"fuzz: {sum(CASES.values())} generated cases ({per_test})")
