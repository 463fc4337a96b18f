"""Load a local task's items from data/*.jsonl, wherever the repository lies.

lm-eval hands `dataset_kwargs` to a `custom_dataset` function; the YAMLs name their file
relative to this folder, and this function makes that path absolute. datasets' own `json`
loader would resolve it against the current directory instead (and write an Arrow cache
under ~/.cache); building the Dataset in memory keeps the tasks offline and side-effect free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load(data_files: dict[str, str], **_ignored: Any):
    """A DatasetDict with one split per `data_files` entry (paths relative to eval/tasks/)."""
    import datasets

    splits = {}
    for split, name in data_files.items():
        path = Path(name) if Path(name).is_absolute() else HERE / name
        with open(path, encoding="utf-8") as f:
            splits[split] = datasets.Dataset.from_list([json.loads(line) for line in f if line.strip()])
    return datasets.DatasetDict(splits)
