"""How a recipe problem is named: `<yaml.path>: <why> (<file>:<line>)`, and the error carrying it.

A user fixes a recipe in an editor, not in a traceback, so every problem the loader, the
cross-field checks and `--stages` find is reported as a YAML path (`a.b[1].c`), the file and
line that defined it, and a "did you mean" for a near-miss name. This module holds those
pieces and RecipeError (the one bad-input type, data.errors.BadInput); it imports nothing else
of the recipe, so every recipe module can use it.
"""

from __future__ import annotations

import difflib
import os
import re
import typing

from stagewise.data.errors import BadInput

RecipeError = BadInput
"""A recipe that cannot be used: the project's one bad-input type (data.errors.BadInput), so
the CLI maps a recipe problem, a bad source line and a broken checkpoint alike to exit 2."""


def join_path(path: str, key: str | int) -> str:
    """One step down a YAML path: `a.b` + `c` -> `a.b.c`, `a.b` + 1 -> `a.b[1]`."""
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def parse_path(text: str) -> list[str | int]:
    """`a.b[1].c` -> ['a', 'b', 1, 'c']; raises ValueError on a malformed path."""
    tokens: list[str | int] = []
    for part in text.split("."):
        m = re.fullmatch(r"([^\[\]]+)((?:\[-?\d+\])*)", part)
        if not m:
            raise ValueError(f"malformed path {text!r}")
        tokens.append(m.group(1))
        tokens += [int(i) for i in re.findall(r"\[(-?\d+)\]", m.group(2))]
    return tokens


def show_file(file: str) -> str:
    """A file as the user should read it: relative to the current directory when inside it."""
    try:
        rel = os.path.relpath(file)
        return file if rel.startswith("..") else rel
    except ValueError:
        return file


def locate(path: str, sources: dict[str, tuple[str, int]], default: str) -> tuple[str, int]:
    """(file, line) of the closest defined ancestor of a YAML path (line 0: no line)."""
    if path in sources:
        return sources[path]
    try:
        tokens = parse_path(path) if path else []
    except ValueError:  # a key with `.` or `[` in it: only an exact match can locate it
        return default, 0
    while tokens:
        at = ""
        for t in tokens:
            at = join_path(at, t)
        if at in sources:
            return sources[at]
        tokens.pop()
    return default, 0


def cite_location(located: tuple[str, int]) -> str:
    """`file:line` as a problem cites it (just the file when there is no line)."""
    file, line = located
    return f"{show_file(file)}:{line}" if line else show_file(file)


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """`; did you mean X?` for the closest choice, or "" when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
