"""The documents of one work unit, in file order: `(ordinal, text)` pairs.

A JSONL unit is a byte range [start, end) of its file: a line belongs to the unit holding its first
byte, so a unit starting mid-file skips the rest of the line it lands in, and reads its last line
past `end`. The ordinal counts the unit's non-blank documents from 0; it names a document in the
dedup shuffle and the write step. Bad lines follow the source's `on_bad_line`: an error names the
file and line (BadInput, exit 2); `skip` counts them (`UnitReader.bad_lines`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from stagewise.data.corpus.plan import WorkUnit
from stagewise.data.row_files import FORMATS, RowFile
from stagewise.data.sources import SourceError, read_texts, read_txt
from stagewise.data.urls import native_or_url, open_input


class UnitReader:
    """Iterate a unit's documents; `bad_lines` counts the lines skipped under `on_bad_line: skip`."""

    def __init__(self, unit: WorkUnit) -> None:
        self.unit, self.bad_lines = unit, 0

    def _bad(self, message: str) -> None:
        if self.unit.on_bad_line == "error":
            raise SourceError(message)
        self.bad_lines += 1

    def __iter__(self) -> Iterator[tuple[int, str]]:
        u = self.unit
        if u.format == "jsonl":
            texts = self._jsonl()
        elif u.format == "parquet":
            texts = self._parquet()
        elif u.format == "txt":
            texts = read_txt(Path(u.file), whole_file=u.whole_file, on_bad=self._bad)
        else:
            texts = read_texts(RowFile(Path(u.file), FORMATS.get(Path(u.file).suffix, u.format)), u.text_field,
                               self._bad)
        return enumerate(texts)

    def _jsonl(self) -> Iterator[str]:
        u, field = self.unit, self.unit.text_field
        with open_input(u.file) as f:
            if u.start > 0:
                f.seek(u.start - 1)
                f.readline()  # the line that began before this unit (or just its newline)
            pos, read = f.tell(), 0
            first_line = None  # the file's line number at `pos`, counted only when an error needs it
            while pos < u.end:
                raw = f.readline()
                if not raw:
                    break
                at, pos, read = pos, pos + len(raw), read + 1
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (ValueError, RecursionError) as e:
                    first_line = first_line or _line_at(u.file, at) - read + 1
                    self._bad(f"{u.file}:{first_line + read - 1}: malformed JSON or not UTF-8 ({e})")
                    continue
                value = obj.get(field) if isinstance(obj, dict) else None
                if not isinstance(value, str):
                    first_line = first_line or _line_at(u.file, at) - read + 1
                    why = ("expected a JSON object" if not isinstance(obj, dict) else
                           "missing text field" if field not in obj else f"expected a string, got {type(value).__name__}")
                    self._bad(f"{u.file}:{first_line + read - 1}: {field}: {why}")
                    continue
                if value.strip():
                    yield value

    def _parquet(self) -> Iterator[str]:
        u = self.unit
        try:
            with native_or_url(u.file) as f:
                table = pq.ParquetFile(f).read_row_groups(list(range(u.start, u.end)), columns=[u.text_field])
        except Exception as e:  # a missing column, a corrupt row group
            raise SourceError(f"{u.file}: row groups {u.start}-{u.end - 1}: unreadable ({e})") from None
        for value in table.column(0).to_pylist():
            if value is None:
                continue
            if not isinstance(value, str):
                self._bad(f"{u.file}: {u.text_field}: expected a string, got {type(value).__name__}")
            elif value.strip():
                yield value


def _line_at(path: str, offset: int) -> int:
    """1-based line number of a byte offset (read only when a bad line must be cited)."""
    n = 1
    with open_input(path) as f:
        left = offset
        while left > 0:
            block = f.read(min(left, 1 << 20))
            if not block:
                break
            n += block.count(b"\n")
            left -= len(block)
    return n
