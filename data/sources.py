"""Reading a source's documents: jsonl, parquet or txt, from a file or a directory of files.

Everything downstream (tokenizer training, shards, digests) sees a source as an ordered
stream of strings, so the order is fixed here: files of a directory in sorted relative-path
order, rows in file order. Bad input stops with a `SourceError` that names the file, the
line (or row) and the field, because "invalid JSON" without a place is useless at 2 GB.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from data.config import WORLD_PREFIX, SourceConfig

SUFFIXES = {"jsonl": (".jsonl",), "parquet": (".parquet",), "txt": (".txt",)}


class SourceError(ValueError):
    """A source cannot be read; the message names the file and, where known, line and field."""


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


def iter_texts(src: SourceConfig, base_dir: Path, world_dir: Path | None = None) -> Iterator[str]:
    """Every document of the source, in a fixed order; empty documents are skipped."""
    per_file = src.format == "txt" and resolve_path(src.path, base_dir, world_dir).is_dir()
    for path in source_files(src, base_dir, world_dir):
        if src.format == "jsonl":
            yield from read_jsonl(path, src.text_field)
        elif src.format == "parquet":
            yield from read_parquet(path, src.text_field)
        else:
            yield from read_txt(path, whole_file=per_file)


def _check_text(value: object, where: str, field: str) -> str:
    if not isinstance(value, str):
        raise SourceError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
    return value


def read_jsonl(path: Path, field: str) -> Iterator[str]:
    """Rows of a jsonl file; blank lines are allowed, anything else must be an object with `field`."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SourceError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise SourceError(f"{where}: expected a JSON object, got {type(row).__name__}")
            if field not in row:
                raise SourceError(f"{where}: missing text field {field!r} (fields: {sorted(row)[:10]})")
            text = _check_text(row[field], where, field)
            if text.strip():
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
    for batch in pf.iter_batches(columns=[field], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value is not None and value.strip():
                yield value


def read_txt(path: Path, whole_file: bool) -> Iterator[str]:
    """A whole file as one document, or one document per blank-line-separated block."""
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise SourceError(f"{path}:{line}: not valid UTF-8 ({e.reason})") from None
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
