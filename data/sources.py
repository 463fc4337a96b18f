"""Reading a source's documents: txt, or the text field of row files (jsonl, parquet, Arrow).

Everything downstream (tokenizer training, shards, digests) sees a source as an ordered
stream of strings, so the order is fixed here: a txt directory's files in sorted relative-path
order; row files as data/row_files.py reads them (a file, a Hugging Face Hub shard folder's
split, a `datasets` save_to_disk directory), rows in file order. Bad input stops with a
`SourceError` (the project's BadInput: exit 2) that names the file, the line (or row) and the
field, because "invalid JSON" without a place is useless at 2 GB. A source with `on_bad_line:
skip` drops such lines instead and counts them in the `bad_lines` dict a caller passes (source
name -> lines dropped), logging the first few.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from stagewise.data.config import WORLD_PREFIX, SourceConfig
from stagewise.data.row_files import FORMATS, RowFile, RowFileError, read_file, row_files

log = logging.getLogger(__name__)

SourceError = RowFileError
"""A source cannot be read; the message names the file and, where known, line and field (the
row readers' one error type, the project's BadInput)."""


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


def resolve_path(path: str, base_dir: str | Path, world_dir: str | Path | None) -> Path:
    """`@world/x` -> world_dir/x; a relative path -> base_dir/path (the recipe's directory); absolute
    paths unchanged. The one way every stage resolves a path the recipe names. A URL (`s3://...`) is refused:
    only the corpus build reads sources by URL (data/urls.py)."""
    if is_url(path):
        raise SourceError(f"{path}: a URL; only `stagewise data build` reads sources by URL (through fsspec): "
                          "copy it to a local or shared filesystem for this step")
    if path.startswith(WORLD_PREFIX):
        if not world_dir:
            raise SourceError(f"{path}: an {WORLD_PREFIX} path needs the demo world (set data.world)")
        return Path(world_dir) / path[len(WORLD_PREFIX):]
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


GLOB_CHARS = frozenset("*?[")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """A path with a protocol (`s3://...`, `file:///...`): read through fsspec by the corpus build
    (data/urls.py), never as a local path."""
    return bool(_URL.match(path))



def is_glob(path: str) -> bool:
    """A source path with glob characters (`shards/part-*.jsonl`, `web/**/*.parquet`)."""
    return any(c in GLOB_CHARS for c in path)


def source_root(src: SourceConfig, base_dir: Path, world_dir: Path | None) -> Path:
    """The directory (or file) a source's files are named relative to: for a glob, the folder above its
    first glob component."""
    root = resolve_path(src.path, base_dir, world_dir)
    if not is_glob(src.path):
        return root
    parts = root.parts
    first = next(i for i, part in enumerate(parts) if is_glob(part))
    return Path(*parts[:first])


def _glob_files(src: SourceConfig, base_dir: Path, world_dir: Path | None) -> list[RowFile]:
    """The files a glob matches, in sorted relative-path order, each read as the source's format or its
    suffix's (.jsonl, .parquet, .arrow; txt files need `format: txt`); hidden names are skipped as in a directory."""
    root = source_root(src, base_dir, world_dir)
    pattern = resolve_path(src.path, base_dir, world_dir).relative_to(root).as_posix()
    found = []
    for p in sorted(root.glob(pattern), key=lambda p: p.relative_to(root).as_posix()):
        if not p.is_file() or any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        fmt = src.format or FORMATS.get(p.suffix)
        if fmt is None:
            raise SourceError(f"source {src.name!r}: {p}: cannot tell its format from the suffix; set `format`")
        found.append(RowFile(p, fmt))
    if not found:
        raise SourceError(f"source {src.name!r}: no files match {src.path} (under {root})")
    return found


def source_files(src: SourceConfig, base_dir: Path, world_dir: Path | None) -> list[Path]:
    """The files of a source, in reading order (what its digest covers)."""
    if is_glob(src.path):
        return [f.path for f in _glob_files(src, base_dir, world_dir)]
    if src.format == "txt":
        return _txt_files(src, resolve_path(src.path, base_dir, world_dir))
    return [f.path for f in source_row_files(src, base_dir, world_dir)]


def source_row_files(src: SourceConfig, base_dir: Path, world_dir: Path | None) -> list[RowFile]:
    """A row source's files (data/row_files.py: a file, or a directory's split in the Hugging Face
    Hub layout or saved by `datasets`); a file read as the source's `format` when it names one."""
    if is_glob(src.path):
        return _glob_files(src, base_dir, world_dir)
    root = resolve_path(src.path, base_dir, world_dir)
    if root.is_file() and src.format is not None and src.split is None:
        return [RowFile(root, src.format)]
    try:
        return row_files(root, src.split, (src.format,) if src.format else None)
    except RowFileError as e:
        raise SourceError(f"source {src.name!r}: {e}") from None


def _txt_files(src: SourceConfig, root: Path) -> list[Path]:
    """A txt file, or the .txt files under a directory in sorted relative-path order."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise SourceError(f"source {src.name!r}: {root} does not exist")
    files = sorted((p for p in root.rglob("*") if p.is_file() and p.suffix == ".txt"
                    and not any(part.startswith(".") for part in p.relative_to(root).parts)),
                   key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise SourceError(f"source {src.name!r}: no txt files under {root}")
    return files


def iter_texts(src: SourceConfig, base_dir: Path, world_dir: Path | None = None,
               bad_lines: dict[str, int] | None = None) -> Iterator[str]:
    """Every document of the source, in a fixed order; empty documents are skipped.

    Bad lines raise SourceError, or with `on_bad_line: skip` are counted in bad_lines[src.name].
    """
    on_bad = _on_bad(src, bad_lines)
    if src.format == "txt":
        per_file = is_glob(src.path) or resolve_path(src.path, base_dir, world_dir).is_dir()
        for path in source_files(src, base_dir, world_dir):
            yield from read_txt(path, whole_file=per_file, on_bad=on_bad)
        return
    for f in source_row_files(src, base_dir, world_dir):
        yield from read_texts(f, src.text_field, on_bad)


def read_texts(f: RowFile | Path, field: str, on_bad: OnBad = _raise) -> Iterator[str]:
    """The `field` strings of a row file (jsonl, parquet or Arrow), non-blank ones only.

    A row without the field, or whose field is not a string, is a bad line; in parquet and Arrow
    a null is an empty document (a column is on every row there, so null is how a row has none)."""
    if not isinstance(f, RowFile):  # a lone file (`stagewise data profile FILE`): JSONL unless its suffix says
        f = RowFile(f, FORMATS.get(f.suffix, "jsonl"))
    for row in read_file(f, columns=[field], on_bad=lambda bad: on_bad(str(bad))):
        value = row.data.get(field)
        if value is None and not row.where.is_line:
            continue
        if field not in row.data:
            on_bad(f"{row.where}: {field}: missing text field (fields: {sorted(row.data)[:10]})")
        elif not isinstance(value, str):
            on_bad(f"{row.where}: {field}: expected a string, got {type(value).__name__}")
        elif value.strip():
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
