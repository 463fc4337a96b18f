"""Row files: the one reader of tabular rows for every stage (pretraining text, SFT, RL tasks).

    for row in iter_rows(path, split=None):      # Row(where, data, line)
        print(row.where, row.data)               # "data/train.jsonl:12", "x.parquet:row 3"

A source path is one of, as teams keep their data:
- a file: `.jsonl` (one JSON object per line; blank lines allowed), `.parquet`, or `.arrow`
  (an Arrow IPC stream, what `datasets` writes, or an Arrow IPC file);
- a `datasets` `save_to_disk` directory: `state.json` lists its `.arrow` files in order (left-over
  `cache-*.arrow` files of `map` calls are not part of it); a `DatasetDict`'s has
  `dataset_dict.json` naming its splits, each a `save_to_disk` directory of that name;
- a shard folder laid out as on the Hugging Face Hub: `.jsonl`, `.parquet` and `.arrow` files
  anywhere under it (other files such as README.md or dataset_info.json, and hidden `.x` / `__x`
  names, are ignored), assigned to splits by the first of these rules that matches any of its files
  (the Hub's own order, `datasets.data_files`):
  1. `data/<split>-NNNNN-of-NNNNN*.<ext>` (what `push_to_hub` writes): any split name;
  2. a folder named for a split: `train/...`, `data/test/...`, `eval_2024/...`;
  3. a file named for a split: `train.jsonl`, `my_train_file.parquet`, `test-00001.parquet`;
  4. otherwise every file is the `train` split.
  In 2 and 3 the keyword stands alone or is delimited by `-`, `_`, `.`, a space or a digit
  (`testfile.jsonl` names no split): train, training -> train; validation, valid, val, dev ->
  validation; test, testing, eval, evaluation -> test. A file that names two splits is an error.

A directory is read as its `train` split unless `split` names another (a missing split is an
error that lists the ones there are); a file is one split, so `split` is refused for it. Files are
read in sorted relative-path order (a `save_to_disk` directory in its state's order), rows in file
order, parquet and Arrow a batch at a time.

Locations: `<file>:<line>` for JSONL (1-based, as an editor shows it) and `<file>:row <i>` for
parquet and Arrow (the 0-based index within that file, as `table.slice(i, 1)` and `ds[i]` count),
so a stage's errors read `<where>: <field>: <why>`. A JSONL line that is not UTF-8, not JSON or not
an object goes to `on_bad` (default: raise); a file that cannot be read at all (missing, corrupt,
a column asked for that is not there) raises RowFileError, the project's BadInput (exit 2).

In Arrow formats every row has every column, and a struct every field: a null is how a row (or a
mapping inside it) lacks one, so the stages read Arrow rows through `present`, which drops
null-valued keys at every depth. Mappings of different shapes in one column (tool-call arguments
as objects) thus come back as written, except a key that was null on purpose; JSON strings (the
OpenAI form of arguments) come back exactly. JSONL rows are taken as written, nulls included.

Why pyarrow and not `datasets` for `save_to_disk` directories: `datasets` is no dependency of this
project (it is installed only as a dependency of lm-eval and trl); `load_from_disk` memory-maps
the very Arrow stream files `pyarrow.ipc.open_stream` reads, so reading them directly gives the
same rows in the same order, a batch at a time like parquet, with nothing added.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stagewise.data.errors import BadInput, read_utf8

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
"""File suffix -> row format."""
SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "val", "dev"),
                  "test": ("test", "testing", "eval", "evaluation")}
"""Split -> the words that name it in a Hub folder's file and folder names."""
DEFAULT_SPLIT = "train"
BATCH_ROWS = 1024
"""Rows per parquet batch (memory stays bounded on any file size)."""
_SEP = r"[-._ 0-9]"
_KEYWORD = {split: re.compile(rf"(?:^|{_SEP})(?:{'|'.join(words)})(?:{_SEP}|$)")
            for split, words in SPLIT_KEYWORDS.items()}
_SHARDED = re.compile(r"^data/(?P<split>[^/]+?)-\d{5}-of-\d{5}[^/]*$")


class RowFileError(BadInput):
    """A row file or directory that cannot be read; the message names the file (and row, field)."""


@dataclass(frozen=True, slots=True)
class Where:
    """Where a row is: the file and its line (JSONL, 1-based) or row index (parquet/Arrow, 0-based)."""

    file: Path
    row: int
    is_line: bool

    def __str__(self) -> str:
        return f"{self.file}:{self.row}" if self.is_line else f"{self.file}:row {self.row}"


@dataclass(frozen=True, slots=True)
class Row:
    """One row: where it is, its fields, and (JSONL) the line as read, without its newline, for a
    caller that writes unchanged rows back byte for byte (data/rl_rows.py)."""

    where: Where
    data: dict[str, Any]
    line: str | None = None


@dataclass(frozen=True, slots=True)
class BadLine:
    """A JSONL line that is no row: where, why, and its bytes (SFT hands them to curation as a reject)."""

    where: Where
    why: str
    raw: bytes

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


OnBad = Callable[[BadLine], None]


def raise_bad(bad: BadLine) -> None:
    """The default bad-line policy: stop, naming the file and line."""
    raise RowFileError(str(bad))


def present(value: Any) -> Any:
    """`value` without null-valued mapping keys, at every depth (list items are kept): how an Arrow
    row reads as the JSON it was made from, since Arrow fills a missing column or field with null."""
    if isinstance(value, dict):
        return {k: present(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [present(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class RowFile:
    """One file to read and its format."""

    path: Path
    format: str


# --------------------------------------------------------------------------- which files

def row_files(path: str | Path, split: str | None = None, formats: tuple[str, ...] | None = None) -> list[RowFile]:
    """The files a path's rows are read from, in order (see the module docstring for the rules).

    `formats` narrows a directory to files of those formats (a source that says `format: jsonl`)."""
    path = Path(path)
    if path.is_file():
        if split is not None:
            raise RowFileError(f"{path}: split: {split!r} given, but a file is one split (name a directory)")
        fmt = FORMATS.get(path.suffix)
        if fmt is None:
            raise RowFileError(f"{path}: not a row file (.jsonl, .parquet or .arrow)")
        return [RowFile(path, fmt)]
    if not path.is_dir():
        raise RowFileError(f"{path}: does not exist")
    if (path / "dataset_dict.json").is_file():
        return _dataset_dict(path, split or DEFAULT_SPLIT)
    if (path / "state.json").is_file():
        return _saved_dataset(path, split)
    return _shard_folder(path, split or DEFAULT_SPLIT, formats)


def _json_file(path: Path) -> Any:
    try:
        return json.loads(read_utf8(path, "dataset metadata"))
    except ValueError as e:
        raise RowFileError(f"{path}: not JSON ({e})") from None


def _dataset_dict(root: Path, split: str) -> list[RowFile]:
    """A DatasetDict.save_to_disk directory: the split's own save_to_disk directory."""
    meta = _json_file(root / "dataset_dict.json")
    splits = meta.get("splits") if isinstance(meta, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise RowFileError(f"{root / 'dataset_dict.json'}: splits: expected a list of split names")
    if split not in splits:
        raise RowFileError(f"{root}: split: no split {split!r} (splits: {', '.join(splits)})")
    if not (root / split / "state.json").is_file():
        raise RowFileError(f"{root / split}: no state.json (not a save_to_disk directory)")
    return _saved_dataset(root / split, None)


def _saved_dataset(root: Path, split: str | None) -> list[RowFile]:
    """A Dataset.save_to_disk directory: the Arrow files its state.json lists, in that order."""
    state = _json_file(root / "state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("filename"), str)
                                              for f in files):
        raise RowFileError(f"{root / 'state.json'}: _data_files: expected a list of {{\"filename\": ...}}")
    own = state.get("_split")
    if split is not None and own is not None and split != own:
        raise RowFileError(f"{root}: split: {split!r} given, but this saved dataset is split {own!r}")
    out = []
    for f in files:
        p = root / f["filename"]
        if not p.is_file():
            raise RowFileError(f"{root / 'state.json'}: lists {f['filename']}, which does not exist")
        out.append(RowFile(p, "arrow"))
    if not out:
        raise RowFileError(f"{root}: state.json lists no data files")
    return out


def split_of(rel: str, rule: str) -> set[str]:
    """The splits a file (path relative to the folder, `/`-separated) belongs to under one rule:
    "sharded", "folder" or "file" (the module docstring's rules 1-3)."""
    if rule == "sharded":
        m = _SHARDED.match(rel)
        return {m["split"]} if m else set()
    parts = rel.split("/")
    names = parts[:-1] if rule == "folder" else parts[-1:]
    return {split for split, pattern in _KEYWORD.items() if any(pattern.search(n) for n in names)}


def splits_of_folder(rels: list[str]) -> dict[str, list[str]]:
    """Split -> files of a Hub shard folder (relative paths, sorted), by the first rule that
    matches any file; files no rule of that kind matches belong to no split."""
    for rule in ("sharded", "folder", "file"):
        found = {rel: split_of(rel, rule) for rel in rels}
        if any(found.values()):
            break
    else:
        return {DEFAULT_SPLIT: sorted(rels)} if rels else {}
    out: dict[str, list[str]] = {}
    for rel, splits in sorted(found.items()):
        if len(splits) > 1:
            raise RowFileError(f"{rel}: names splits {', '.join(sorted(splits))}; rename it to name one")
        for split in splits:
            out.setdefault(split, []).append(rel)
    return out


def _shard_folder(root: Path, split: str, formats: tuple[str, ...] | None) -> list[RowFile]:
    wanted = {s: f for s, f in FORMATS.items() if formats is None or f in formats}
    rels = [p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and p.suffix in wanted
            and not any(part.startswith((".", "__")) for part in p.relative_to(root).parts)]
    if not rels:
        kinds = ", ".join(sorted(wanted)) or "row"
        raise RowFileError(f"{root}: no {kinds} files under it (nor a save_to_disk state.json)")
    try:
        splits = splits_of_folder(rels)
    except RowFileError as e:
        raise RowFileError(f"{root}/{e}") from None
    if split not in splits:
        raise RowFileError(f"{root}: split: no split {split!r} (splits: {', '.join(sorted(splits))})")
    return [RowFile(root / rel, wanted[Path(rel).suffix]) for rel in splits[split]]


# --------------------------------------------------------------------------- the rows

def iter_rows(path: str | Path, split: str | None = None, *, formats: tuple[str, ...] | None = None,
              columns: list[str] | None = None, on_bad: OnBad = raise_bad) -> Iterator[Row]:
    """Every row of a file or directory, in order (see the module docstring).

    `columns` reads only those columns of parquet/Arrow files (RowFileError naming the file and
    the column when one is not there); JSONL rows are whole objects either way."""
    for f in row_files(path, split, formats):
        yield from read_file(f, columns=columns, on_bad=on_bad)


def read_file(f: RowFile, *, columns: list[str] | None = None, on_bad: OnBad = raise_bad) -> Iterator[Row]:
    """The rows of one file."""
    if f.format == "jsonl":
        return read_jsonl(f.path, on_bad)
    return _read_arrow(f.path, f.format, columns)


def read_jsonl(path: Path, on_bad: OnBad = raise_bad) -> Iterator[Row]:
    """Rows of a JSONL file: every non-blank line must be a JSON object (else `on_bad`)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise RowFileError(f"{path}: cannot read: {e.strerror or e}") from None
    with f:
        for lineno, raw in enumerate(f, start=1):
            where = Where(path, lineno, True)
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                on_bad(BadLine(where, f"not valid UTF-8 ({e.reason} at byte {e.start})", raw))
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:  # JSONDecodeError, and a number too long to convert
                why = f"malformed JSON ({getattr(e, 'msg', e)} at column {getattr(e, 'colno', '?')})"
                on_bad(BadLine(where, why, raw))
                continue
            except RecursionError:
                on_bad(BadLine(where, "malformed JSON (nested too deeply)", raw))
                continue
            if not isinstance(obj, dict):
                on_bad(BadLine(where, f"expected a JSON object, got {type(obj).__name__}", raw))
                continue
            yield Row(where, obj, line)


def _batches(path: Path, fmt: str, columns: list[str] | None):
    """(schema names, an iterator of record batches) of a parquet or Arrow file."""
    if fmt == "parquet":
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises several types for a bad file
            raise RowFileError(f"{path}: not a readable parquet file ({e})") from None
        names = pf.schema_arrow.names
        _check_columns(path, names, columns)
        return pf.iter_batches(columns=columns, batch_size=BATCH_ROWS)
    try:
        source = pa.memory_map(str(path))
        try:
            reader = pa.ipc.open_stream(source)  # what datasets writes
            batches = iter(reader)
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    except Exception as e:
        raise RowFileError(f"{path}: not a readable Arrow file ({e})") from None
    _check_columns(path, reader.schema.names, columns)
    if columns is None:
        return batches
    return (b.select(columns) for b in batches)


def _check_columns(path: Path, names: list[str], columns: list[str] | None) -> None:
    for c in columns or []:
        if c not in names:
            raise RowFileError(f"{path}: {c}: no such column (columns: {names[:20]})")


def _read_arrow(path: Path, fmt: str, columns: list[str] | None) -> Iterator[Row]:
    batches = _batches(path, fmt, columns)
    row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # a truncated or corrupt row group / message
            raise RowFileError(f"{path}: unreadable after row {row} ({e})") from None
        try:
            values = batch.to_pylist()
        except Exception as e:  # a corrupt page: bytes that are not UTF-8, bad offsets
            raise RowFileError(f"{path}: rows {row}-{row + batch.num_rows - 1}: unreadable ({e})") from None
        for data in values:
            yield Row(Where(path, row, False), data)
            row += 1
