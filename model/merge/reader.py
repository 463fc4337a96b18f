"""Read one tensor at a time from safetensors files into a reused buffer.

Why not `safe_open(...).get_tensor`: it maps the whole file and returns tensors that are
views of the mapping, so every page read stays resident (it counts in RSS) until the
handle closes, and each first touch of a page is a page fault, which dominates the merge's
time on virtual machines (measured here: ~10x slower than a read into a warm buffer).
`os.preadv` into one buffer sized for the largest tensor copies straight from the page
cache, keeps memory at exactly that buffer, and needs no handle juggling. The header
(offsets, dtypes, shapes) comes from model/merge/layout.py; the bytes are checked against
its size, and the tests compare every value with safetensors' own loader.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from stagewise.model.merge.layout import TensorInfo
from stagewise.model.merge.st_writer import TORCH_DTYPES


class TensorReader:
    """`read(path, info)` returns a tensor that is a view of a shared buffer, valid until the next read."""

    def __init__(self, max_bytes: int):
        self._buf = torch.empty(max(1, max_bytes), dtype=torch.uint8)
        self._view = memoryview(self._buf.numpy())
        self._fds: dict[Path, int] = {}

    def read(self, path: Path, info: TensorInfo) -> torch.Tensor:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        done = 0
        while done < info.nbytes:  # preadv may return short counts
            n = os.preadv(fd, [self._view[done:info.nbytes]], info.offset + done)
            if n <= 0:
                raise OSError(f"{path}: file ends inside tensor data (offset {info.offset + done})")
            done += n
        return self._buf[: info.nbytes].view(TORCH_DTYPES[info.dtype]).reshape(info.shape)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
