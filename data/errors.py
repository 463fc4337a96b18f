"""BadInput: the one exception for input a person must fix (the CLI exits 2 with its message).

A recipe field, a source file's line, a checkpoint directory, a rule file or a `--set` value
that cannot be used is the user's to fix in an editor, not a failure of the program, so every
library raises this one type with a message that names the field, file and line, and the
`stagewise` command maps it to exit 2 without a traceback (anything else is exit 1). It lives
in `data`, the library every other one may import (data imports no other library), and
depends on nothing; recipe.errors.RecipeError is this same class.
"""

from __future__ import annotations


class BadInput(ValueError):
    """Input that cannot be used; str() is the whole message a user sees (no traceback needed).

    `problems` holds one located problem per line (`<where>: <why>`); `title`, when given,
    is printed above them.
    """

    def __init__(self, problems: str | list[str], title: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = [title, *(f"  {p}" for p in self.problems)] if title else self.problems
        super().__init__("\n".join(lines))


def line_of(data: bytes, offset: int) -> int:
    """1-based line number of a byte offset (to cite where undecodable bytes start)."""
    return data.count(b"\n", 0, offset) + 1


def decode_utf8(data: bytes, where: str) -> str:
    """Bytes as UTF-8 text, or BadInput citing `<where>:<line>` of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}:{line_of(data, e.start)}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def read_utf8(path, what: str = "") -> str:
    """A file's text, or BadInput naming the file: unreadable (missing, a directory, no permission)
    or not UTF-8 (citing the line of the first bad byte). `what` says what the file is for."""
    try:
        raw = open(path, "rb").read()
    except OSError as e:
        raise BadInput(f"{path}: cannot read{f' the {what}' if what else ''}: {e.strerror or e}") from None
    return decode_utf8(raw, str(path))
