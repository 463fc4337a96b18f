"""Megatron's indexed dataset format (`<prefix>.bin` + `<prefix>.idx`): writing and reading it.

Megatron-Bridge pretrains from megatron-core's `IndexedDataset`: a `.bin` of raw tokens and an
`.idx` describing them. The corpus build (data/corpus/) writes its shards in this format directly,
and engines/megatron/indexed_data.py converts the demo's prepared shards to it; both go through
`index_bytes`, so there is one writer of the layout.

The `.idx` layout (megatron-core `indexed_dataset._IndexWriter`, little endian):
    b"MMIDIDX\\x00\\x00"          9-byte header
    uint64 1                      version
    uint8 dtype code              1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    uint64 sequence count         one sequence per document here
    uint64 document count + 1     the length of the document index below
    int32[sequences]              tokens per sequence
    int64[sequences]              byte offset of each sequence in the .bin
    int64[documents + 1]          document index: sequence numbers where documents start, then the count
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
               np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}
"""megatron-core's DType codes."""


def indexed_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else int32 (Megatron has no uint32 code)."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


def index_bytes(doc_offsets: np.ndarray, dtype: np.dtype) -> bytes:
    """The `.idx` contents for documents bounded by `doc_offsets` (n_docs + 1 token offsets)."""
    offsets = np.asarray(doc_offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise ValueError("doc_offsets must start at 0 and never decrease")
    lengths = np.diff(offsets)
    if lengths.size and lengths.max() > np.iinfo(np.int32).max:
        raise ValueError("a document longer than 2^31 - 1 tokens does not fit Megatron's int32 sizes")
    dtype = np.dtype(dtype)
    if dtype not in DTYPE_CODES:
        raise ValueError(f"Megatron indexed datasets have no code for dtype {dtype}")
    n = lengths.size
    head = INDEX_HEADER + struct.pack("<Q", INDEX_VERSION) + struct.pack("<B", DTYPE_CODES[dtype])
    head += struct.pack("<Q", n) + struct.pack("<Q", n + 1)
    pointers = offsets[:-1] * dtype.itemsize
    return (head + lengths.astype("<i4").tobytes() + pointers.astype("<i8").tobytes()
            + np.arange(n + 1, dtype="<i8").tobytes())


def read_indexed(prefix: Path) -> list[np.ndarray]:
    """The documents of an indexed dataset, as megatron-core would read them (for checks and tests)."""
    prefix = Path(prefix)
    raw = prefix.with_name(prefix.name + ".idx").read_bytes()
    if raw[:9] != INDEX_HEADER:
        raise ValueError(f"{prefix}.idx: not a Megatron index (header {raw[:9]!r})")
    version, code = struct.unpack("<Q", raw[9:17])[0], raw[17]
    if version != INDEX_VERSION:
        raise ValueError(f"{prefix}.idx: index version {version}, expected {INDEX_VERSION}")
    dtype = next(d for d, c in DTYPE_CODES.items() if c == code)
    n, n_docs = struct.unpack("<QQ", raw[18:34])
    at = 34
    sizes = np.frombuffer(raw, "<i4", n, at)
    pointers = np.frombuffer(raw, "<i8", n, at + 4 * n)
    np.frombuffer(raw, "<i8", n_docs, at + 12 * n)  # the document index: present and complete
    data = np.fromfile(prefix.with_name(prefix.name + ".bin"), dtype=dtype.newbyteorder("<"))
    return [data[p // dtype.itemsize: p // dtype.itemsize + s] for p, s in zip(pointers, sizes)]
