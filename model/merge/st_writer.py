"""Write a safetensors file one tensor at a time, so the output never sits whole in memory.

safetensors' own `save_file` takes a complete dict of tensors. Here the names, dtypes and
shapes are known before any weight is computed (they are the inputs'), so the header with
every offset can be written first and each tensor's bytes appended as soon as it is
merged. Layout rules match the format (https://github.com/huggingface/safetensors):
8-byte little-endian header length, JSON header padded with spaces to a multiple of 8,
then the tensors back to back with no gaps. Tensors are ordered by item size (largest
first), then name, as safetensors does, so every tensor is aligned to its item size.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
"""Dtypes that are averaged. FP8 codes (and every integer or bool) must be equal across inputs:
averaging quantization codes without their scales would be meaningless."""


def _itemsize(dtype: str) -> int:
    return torch.empty(0, dtype=TORCH_DTYPES[dtype]).element_size()


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * _itemsize(dtype)


class StreamingSafetensorsWriter:
    """`write(name, tensor)` in `order`, then `close()` (fsyncs). Refuses anything out of plan."""

    def __init__(self, path: str | os.PathLike, entries: dict[str, tuple[str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None):
        if sys.byteorder != "little":
            raise RuntimeError("safetensors is little-endian; this writer assumes a little-endian machine")
        self.path = Path(path)
        self.order = sorted(entries, key=lambda n: (-_itemsize(entries[n][0]), n))
        header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
        offset = 0
        for name in self.order:
            dtype, shape = entries[name]
            size = nbytes(dtype, shape)
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        self.entries, self.total_bytes = entries, offset
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        self._file = open(self.path, "wb")
        self._hash = hashlib.sha256()  # of the whole file, as it is written: no re-read to fingerprint it
        self._emit(struct.pack("<Q", len(blob)) + blob)
        self._next = 0

    def _emit(self, data) -> None:
        self._file.write(data)
        self._hash.update(data)

    @property
    def sha256(self) -> str:
        """sha256 of the file written so far (the whole file after close())."""
        return self._hash.hexdigest()

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next tensor; it must be the expected name, dtype and shape."""
        if self._next >= len(self.order) or name != self.order[self._next]:
            want = self.order[self._next] if self._next < len(self.order) else "nothing"
            raise ValueError(f"{self.path.name}: expected {want} next, got {name}")
        dtype, shape = self.entries[name]
        if tensor.dtype != TORCH_DTYPES[dtype] or tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name}: got {tensor.dtype} {list(tensor.shape)}, planned {dtype} {list(shape)}")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        if flat.numel():
            self._emit(memoryview(flat.view(torch.uint8).numpy()))
        self._next += 1

    def close(self) -> None:
        """Check every tensor was written, flush and fsync."""
        if self._next != len(self.order):
            self._file.close()
            raise ValueError(f"{self.path.name}: {len(self.order) - self._next} tensors not written")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def abort(self) -> None:
        self._file.close()
