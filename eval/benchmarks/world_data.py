"""Load a local task's items from data/*.jsonl, wherever the repository lies.

lm-eval hands `dataset_kwargs` to a `custom_dataset` function; the YAMLs name their file
relative to this folder, and this function makes that path absolute before the shared reader
(eval/local_data.py, which standard tasks on local files use too) builds the Dataset in memory.
datasets' own `json` loader would resolve it against the current directory instead (and write
an Arrow cache under ~/.cache); in memory keeps the tasks offline and side-effect free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagewise.eval.local_data import load as load_files

HERE = Path(__file__).resolve().parent


def load(data_files: dict[str, str], **_ignored: Any):
    """A DatasetDict with one split per `data_files` entry (paths relative to eval/benchmarks/)."""
    return load_files({split: str(HERE / name) for split, name in data_files.items()})
