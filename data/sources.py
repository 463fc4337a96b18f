"""Reading a source's documents: jsonl, parquet or txt, from a file or a directory of files.

Everything downstream (tokenizer training, shards, digests) sees a source as an ordered
stream of strings, so the order is fixed here: files of a directory in sorted relative-path
order, rows in file order. Bad input stops with a `SourceError` (the project's BadInput: exit
2) that names the file, the line (or row) and the field, because "invalid JSON" without a place
is useless at 2 GB. A source with `on_bad_line: skip` drops such lines instead and counts them
in the `bad_lines` dict a caller passes (source name -> lines dropped), logging the first few.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from stagewise.data.config import WORLD_PREFIX, SourceConfig
from stagewise.data.errors import BadInput

log = logging.getLogger(__name__)

SUFFIXES = {"jsonl": (".jsonl",), "parquet": (".parquet",), "txt": (".txt",)}


class SourceError(BadInput):
    """A source cannot be read; the message names the file and, where known, line and field."""


OnBad = Callable[[str], None]
"""What a reader does with a bad line's message: raise it (on_bad_line: error) or count it (skip)."""


def _raise(message: str) -> None:
    raise SourceError(message)


def _on_bad(src: SourceConfig, bad_lines: dict[str, int] | None) -> OnBad:
    """The bad-line policy of a source: raise, or count into bad_lines[src.name] and go on."""
    if src.on_bad_line == "error":
        return _raise

    def skip(message: str) -> None:
        n = (bad_lines.get(src.name, 0) if bad_lines is not None else 0) + 1
        if bad_lines is not None:
            bad_lines[src.name] = n
        if n <= 3:
            log.warning("source %r: skipped %s", src.name, message)

    return skip


def resolve_path(path: str, base_dir: Path, world_dir: Path | None) -> Path:
    """`@world/x` -> world_dir/x; a relative path -> base_dir/path; absolute paths unchanged."""
    if path.startswith(WORLD_PREFIX):
        if world_dir is None:
            raise SourceError(f"{path}: an {WORLD_PREFIX} path needs the demo world (set data.world)")
        return Path(world_dir) / path[len(WORLD_PREFIX):]
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


def source_files(src: SourceConfig, base_dir: Path, world_dir: Path | None) -> list[Path]:
    """The files of a source: the path itself, or the matching files under a directory, sorted."""
    root = resolve_path(src.path, base_dir, world_dir)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SourceError(f"source {src.name!r}: {root} does not exist")
    files = sorted((p for p in root.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES[src.format])
                    and not any(part.startswith(".") for part in p.relative_to(root).parts)),
                   key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise SourceError(f"source {src.name!r}: no {src.format} files under {root}")
    return files


def iter_texts(src: SourceConfig, base_dir: Path, world_dir: Path | None = None,
               bad_lines: dict[str, int] | None = None) -> Iterator[str]:
    """Every document of the source, in a fixed order; empty documents are skipped.

    Bad lines raise SourceError, or with `on_bad_line: skip` are counted in bad_lines[src.name].
    """
    per_file = src.format == "txt" and resolve_path(src.path, base_dir, world_dir).is_dir()
    on_bad = _on_bad(src, bad_lines)
    for path in source_files(src, base_dir, world_dir):
        if src.format == "jsonl":
            yield from read_jsonl(path, src.text_field, on_bad)
        elif src.format == "parquet":
            yield from read_parquet(path, src.text_field)
        else:
            yield from read_txt(path, whole_file=per_file, on_bad=on_bad)


def _row_problem(line: str, field: str) -> tuple[str | None, str]:
    """(text, "") for a good jsonl line, else (None, why); blank lines are ("", "")."""
    if not line.strip():
        return "", ""
    try:
        row = json.loads(line)
    except ValueError as e:  # JSONDecodeError, and a number too long to convert
        return None, f"malformed JSON ({getattr(e, 'msg', e)} at column {getattr(e, 'colno', '?')})"
    except RecursionError:
        return None, "malformed JSON (nested too deeply)"
    if not isinstance(row, dict):
        return None, f"expected a JSON object, got {type(row).__name__}"
    if field not in row:
        return None, f"missing text field {field!r} (fields: {sorted(row)[:10]})"
    if not isinstance(row[field], str):
        return None, f"field {field!r} must be a string, got {type(row[field]).__name__}"
    return row[field], ""


def read_jsonl(path: Path, field: str, on_bad: OnBad = _raise) -> Iterator[str]:
    """Rows of a jsonl file; blank lines are allowed, anything else must be an object with `field`."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                on_bad(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})")
                continue
            text, why = _row_problem(line, field)
            if text is None:
                on_bad(f"{where}: {why}")
            elif text.strip():
                yield text


def read_parquet(path: Path, field: str) -> Iterator[str]:
    """The `field` column (a string column) of a parquet file, batch by batch; nulls are skipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise SourceError(f"{path}: not a readable parquet file ({e})") from None
    if field not in pf.schema_arrow.names:
        raise SourceError(f"{path}: missing text field {field!r} (columns: {pf.schema_arrow.names})")
    kind = pf.schema_arrow.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise SourceError(f"{path}: field {field!r} must be a string column, got {kind}")
    batches = pf.iter_batches(columns=[field], batch_size=4096)
    row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # a truncated or corrupt row group
            raise SourceError(f"{path}: unreadable after row {row} ({e})") from None
        try:
            values = batch.column(0).to_pylist()
        except Exception as e:  # a corrupt page: bytes that are not UTF-8, bad offsets
            raise SourceError(f"{path}: rows {row + 1}-{row + batch.num_rows}: unreadable ({e})") from None
        for value in values:
            row += 1
            if value is not None and value.strip():
                yield value


def read_txt(path: Path, whole_file: bool, on_bad: OnBad = _raise) -> Iterator[str]:
    """A whole file as one document, or one document per blank-line-separated block.

    A line that is not UTF-8 is a bad line: an error, or (skip) dropped and counted.
    """
    data = path.read_bytes()
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError:
        kept = []
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            try:
                kept.append(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                on_bad(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start} of the line)")
        content = "\n".join(kept)
    if whole_file:
        if content.strip():
            yield content.strip("\n")
        return
    block: list[str] = []
    for line in content.splitlines():
        if line.strip():
            block.append(line)
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)
