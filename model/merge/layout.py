"""What a checkpoint's weights look like on disk, read from safetensors headers only, and the
checks that refuse to merge checkpoints that are not the same model.

A safetensors file is an 8-byte little-endian header length, a JSON header
({name: {dtype, shape, data_offsets}, "__metadata__": {...}}) and the raw bytes. Reading the
header alone tells names, shapes and dtypes without touching a single weight, so the
checks cost milliseconds whatever the model size. A checkpoint is either one
`model.safetensors` or shards listed by `model.safetensors.index.json` (its `weight_map`).

Checks, in order, each naming the first mismatch: config.json (ignoring keys that say
nothing about the weights, e.g. `_name_or_path`, `transformers_version`), then tensor names,
then each tensor's dtype and shape.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagewise.model.merge.errors import MergeInputError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "_commit_hash", "use_cache"})
"""config.json keys that may differ between checkpoints of one model (provenance, runtime flags)."""
_MAX_HEADER = 100 * 2**20


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it."""

    dtype: str
    """safetensors dtype name: F32, BF16, F16, I64, BOOL, ..."""
    shape: tuple[int, ...]
    file: str
    """The file (name inside the checkpoint) that holds it."""
    offset: int = 0
    """Byte offset of its data from the start of the file."""
    nbytes: int = 0
    """Size of its data in bytes."""

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        return self.dtype, self.shape


@dataclass(frozen=True)
class WeightLayout:
    """A checkpoint's weight files and tensors."""

    root: Path
    files: tuple[str, ...]
    """Weight file names in order (one, or the shards)."""
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    """`__metadata__` of the first file (e.g. {"format": "pt"}), carried to the output."""

    @property
    def sharded(self) -> bool:
        return (self.root / INDEX).is_file()

    def names_in(self, file: str) -> list[str]:
        return [n for n, t in self.tensors.items() if t.file == file]


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, str], int]:
    """(tensor entries, __metadata__, byte offset where the data starts) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise MergeInputError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER:
            raise MergeInputError(f"{path}: not a safetensors file (header length {n})")
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", None) or {}
    return header, meta, 8 + n


def read_layout(ckpt: str | Path) -> WeightLayout:
    """The weight layout of a checkpoint directory (single file or sharded)."""
    root = Path(ckpt)
    if not root.is_dir():
        raise MergeInputError(f"{root}: not a checkpoint directory")
    if (root / INDEX).is_file():
        weight_map: dict[str, str] = json.loads((root / INDEX).read_text())["weight_map"]
        files = tuple(sorted(set(weight_map.values())))
    elif (root / SINGLE).is_file():
        weight_map, files = {}, (SINGLE,)
    else:
        raise MergeInputError(f"{root}: no {SINGLE} or {INDEX}")
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, str] = {}
    for i, name in enumerate(files):
        if not (root / name).is_file():
            raise MergeInputError(f"{root}: {INDEX} names {name}, which is missing")
        header, meta, data_start = read_header(root / name)
        metadata = metadata if i else meta
        for tname, entry in header.items():
            if weight_map and weight_map.get(tname) != name:
                raise MergeInputError(f"{root}: tensor {tname} is in {name} but the index says {weight_map.get(tname)}")
            begin, end = entry["data_offsets"]
            tensors[tname] = TensorInfo(entry["dtype"], tuple(entry["shape"]), name, data_start + begin, end - begin)
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise MergeInputError(f"{root}: {INDEX} lists {missing[0]}, which no shard holds")
    return WeightLayout(root, files, tensors, metadata)


def comparable_config(ckpt: Path) -> dict[str, Any]:
    """config.json without the keys in IGNORED_CONFIG_KEYS."""
    path = Path(ckpt) / "config.json"
    if not path.is_file():
        raise MergeInputError(f"{ckpt}: no config.json")
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in IGNORED_CONFIG_KEYS}


def _first_difference(a: Any, b: Any, at: str = "") -> tuple[str, Any, Any] | None:
    """(key path, a's value, b's value) of the first difference, keys in sorted order."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            here = f"{at}.{key}" if at else key
            if key not in a or key not in b:
                return here, a.get(key, "<missing>"), b.get(key, "<missing>")
            found = _first_difference(a[key], b[key], here)
            if found:
                return found
        return None
    return None if a == b else (at, a, b)


def check_compatible(paths: list[Path]) -> list[WeightLayout]:
    """The layouts of `paths`; MergeInputError naming the first mismatch against paths[0]."""
    ref, ref_cfg = Path(paths[0]), comparable_config(paths[0])
    layouts = [read_layout(ref)]
    for other in map(Path, paths[1:]):
        diff = _first_difference(ref_cfg, comparable_config(other))
        if diff:
            key, a, b = diff
            raise MergeInputError(f"config.json differs at {key!r}: {a!r} in {ref} vs {b!r} in {other}")
        layouts.append(read_layout(other))
        _check_tensors(layouts[0], layouts[-1])
    return layouts


def _check_tensors(a: WeightLayout, b: WeightLayout) -> None:
    names_a, names_b = set(a.tensors), set(b.tensors)
    if names_a != names_b:
        name = sorted(names_a ^ names_b)[0]
        has, lacks = (a.root, b.root) if name in names_a else (b.root, a.root)
        raise MergeInputError(f"tensor {name} is in {has} but not in {lacks}")
    for name in sorted(names_a):
        ta, tb = a.tensors[name], b.tensors[name]
        if ta.dtype != tb.dtype:
            raise MergeInputError(f"tensor {name}: dtype {ta.dtype} in {a.root} vs {tb.dtype} in {b.root}")
        if ta.shape != tb.shape:
            raise MergeInputError(f"tensor {name}: shape {list(ta.shape)} in {a.root} vs {list(tb.shape)} in {b.root}")
