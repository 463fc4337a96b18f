"""A task's dataset from local files: one JSONL or Parquet file (or shards) per split, read in memory.

    evaldata/gsm8k/test.jsonl, evaldata/gsm8k/train.jsonl
    evaldata/arc_easy/test-00000-of-00001.parquet        (a Hugging Face download's shard name)

A file's split is its name up to the first `.` or `-`. lm-eval hands a task's `dataset_kwargs`
to its `custom_dataset` function; `load` is that function for standard tasks on local files
(eval/standard_tasks.py), and our local tasks' loader (eval/benchmarks/world_data.py) calls it too.
It builds the Dataset in memory: datasets' own `json`/`parquet` builders would also work
offline, but write an Arrow cache under ~/.cache and resolve relative paths against the
current directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

SUFFIXES = (".jsonl", ".parquet")
"""The file types a split may be given as (JSON Lines, one object per line; or Parquet)."""


def split_of(path: Path) -> str:
    """`test.jsonl` -> test, `train-00000-of-00002.parquet` -> train."""
    return path.name.split(".", 1)[0].split("-", 1)[0]


def split_files(folder: Path) -> dict[str, list[Path]]:
    """split -> its data files (sorted) in a folder; other files are not data and are left alone."""
    out: dict[str, list[Path]] = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix in SUFFIXES:
            out.setdefault(split_of(path), []).append(path)
    return out


def first_row(path: Path) -> dict[str, Any] | None:
    """The first row of a data file (None when it has none); ValueError naming the line of bad JSON."""
    if path.suffix == ".parquet":
        file = pq.ParquetFile(path)
        for group in range(file.num_row_groups):
            table = file.read_row_group(group)
            if table.num_rows:
                return table.slice(0, 1).to_pylist()[0]
        return None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                return _row(line, path, number)
    return None


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of one data file."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        return [_row(line, path, n) for n, line in enumerate(f, 1) if line.strip()]


def _row(line: str, path: Path, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}")
    return row


def load(data_files: dict[str, str | list[str]], **_ignored: Any):
    """A DatasetDict with one split per `data_files` entry (paths: a file or a list of shards).

    lm-eval's custom_dataset hook: it also passes the task's metadata, ignored here."""
    import datasets  # noqa: PLC0415 (datasets: 0.6 s to import, only for a suite on local files)

    splits = {}
    for split, names in data_files.items():
        paths = [Path(n) for n in ([names] if isinstance(names, str) else names)]
        splits[split] = datasets.Dataset.from_list([row for p in paths for row in read_rows(p)])
    return datasets.DatasetDict(splits)
