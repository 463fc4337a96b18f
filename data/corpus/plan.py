"""The shard plan: a corpus's input files cut into work units, fixed before any work starts.

Each work unit becomes one output shard pair (train and val), so the plan alone decides what goes
where: output never depends on how many workers ran or which finished first. Units come from the
sources in recipe order, their files in reading order (data/sources.py), and within a file:
- JSONL: byte ranges of about `shard_bytes`; a line belongs to the range holding its first byte
  (data/corpus/read.py), so ranges can be cut without reading the file;
- parquet: runs of whole row groups of about `shard_bytes` (uncompressed, from the footer);
- Arrow and txt files: one unit each.

The plan is written to `<out>/plan.json` first. A rerun into the same directory must plan the same
units from the same file sizes, else it is refused (the directory holds another corpus's shards).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

import pyarrow.parquet as pq

from stagewise.data.config import SourceConfig
from stagewise.data.errors import BadInput
from stagewise.data.row_files import FORMATS
from stagewise.data.sources import is_glob, is_url, resolve_path, source_files, source_row_files
from stagewise.data.urls import native_or_url, url_files, url_size

PLAN = "plan.json"
PLAN_FORMAT = 1


@dataclass(frozen=True)
class WorkUnit:
    """One unit of work: a slice of one input file of one source."""

    id: int
    source: str
    file: str
    format: str
    start: int
    """JSONL: first byte; parquet: first row group; else 0."""
    end: int
    """JSONL: end byte (exclusive); parquet: end row group (exclusive); else 0 (the whole file)."""
    bytes: int
    """Input bytes the unit covers (what progress and rates count)."""
    text_field: str
    on_bad_line: str
    whole_file: bool = False
    """txt: the whole file is one document (a directory or glob of txt files), else blank-line blocks."""

    @property
    def name(self) -> str:
        return f"part-{self.id:05d}"


def _files(src: SourceConfig, base_dir: Path, world_dir: Path | None) -> list[tuple[Path | str, str]]:
    """(file, format) of a source in reading order; a URL source's files as URLs (data/urls.py)."""
    if is_url(src.path):
        return _url_files(src)
    if src.format == "txt":
        whole = is_glob(src.path) or resolve_path(src.path, base_dir, world_dir).is_dir()
        return [(p, "txt-whole" if whole else "txt") for p in source_files(src, base_dir, world_dir)]
    return [(f.path, f.format) for f in source_row_files(src, base_dir, world_dir)]


def _url_files(src: SourceConfig) -> list[tuple[str, str]]:
    """A URL source's files: JSONL and parquet (cut into units by byte range and row group, read with seeks)."""
    found = []
    for url in url_files(src.path):
        fmt = src.format or FORMATS.get(PurePosixPath(url.split("?", 1)[0]).suffix)
        if fmt not in ("jsonl", "parquet"):
            raise BadInput(f"source {src.name!r}: {url}: a URL source reads JSONL and parquet files"
                           f"{'' if fmt else ' (set `format` where the suffix does not say)'}; "
                           f"copy {fmt or 'other'} files to a local or shared filesystem")
        found.append((url, fmt))
    if not found:
        raise BadInput(f"source {src.name!r}: no files match {src.path}")
    return found


def _parquet_ranges(path: Path | str, shard_bytes: int) -> list[tuple[int, int, int]]:
    """(first row group, end row group, bytes) runs of about shard_bytes."""
    try:
        with native_or_url(str(path)) as f:
            meta = pq.ParquetFile(f).metadata
    except BadInput:
        raise
    except Exception as e:  # pyarrow raises several types for a bad file
        raise BadInput(f"{path}: not a readable parquet file ({e})") from None
    ranges, first, size = [], 0, 0
    for g in range(meta.num_row_groups):
        size += meta.row_group(g).total_byte_size
        if size >= shard_bytes:
            ranges.append((first, g + 1, size))
            first, size = g + 1, 0
    if first < meta.num_row_groups or not ranges:
        ranges.append((first, meta.num_row_groups, size))
    return ranges


def make_plan(sources: list[SourceConfig], base_dir: Path, world_dir: Path | None, shard_bytes: int) -> dict:
    """The plan (JSON-ready): the units and the file sizes it was made from."""
    units: list[WorkUnit] = []
    files = []
    for src in sources:
        for path, fmt in _files(src, base_dir, world_dir):
            size = url_size(path) if is_url(str(path)) else Path(path).stat().st_size
            files.append([str(path), size])
            common = {"source": src.name, "file": str(path), "text_field": src.text_field,
                      "on_bad_line": src.on_bad_line}
            if fmt == "jsonl":
                n = max(1, math.ceil(size / shard_bytes))
                cuts = [size * i // n for i in range(n + 1)]
                for a, b in zip(cuts, cuts[1:]):
                    units.append(WorkUnit(len(units), format="jsonl", start=a, end=b, bytes=b - a, **common))
            elif fmt == "parquet":
                for a, b, nbytes in _parquet_ranges(path, shard_bytes):
                    units.append(WorkUnit(len(units), format="parquet", start=a, end=b, bytes=nbytes, **common))
            else:
                units.append(WorkUnit(len(units), format="txt" if fmt.startswith("txt") else fmt, start=0, end=0,
                                      bytes=size, whole_file=fmt == "txt-whole", **common))
    return {"format": PLAN_FORMAT, "shard_bytes": shard_bytes, "files": files,
            "units": [asdict(u) for u in units]}


def units_of(plan: dict) -> list[WorkUnit]:
    return [WorkUnit(**u) for u in plan["units"]]


def freeze_plan(plan: dict, out: Path) -> dict:
    """Write the plan to `<out>/plan.json`, or check it equals the one there (BadInput if not)."""
    path = Path(out) / PLAN
    if path.is_file():
        old = json.loads(path.read_text())
        if old != plan:
            changed = sorted({f for f, _ in old.get("files", [])} ^ {f for f, _ in plan["files"]}) or [
                f for (f, a), (_, b) in zip(old.get("files", []), plan["files"]) if a != b]
            raise BadInput(f"{out}: holds the shards of another plan (its inputs or shard size differ"
                           f"{': ' + ', '.join(changed[:3]) if changed else ''}); build into a new directory")
        return old
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan, indent=1, sort_keys=True))
    tmp.replace(path)
    return plan
