"""Our tokenized shards as Megatron indexed datasets (`<prefix>.bin` + `<prefix>.idx`), for `engine: megatron`.

Megatron-Bridge pretrains from megatron-core's `IndexedDataset`: a `.bin` of raw tokens and an
`.idx` describing them. Our shards (data/shards.py) already hold the same thing — a flat token
file and document boundaries — so the hand-off writes the tokens once more in Megatron's layout
rather than re-tokenizing (the documents, their order and the eos that ends each stay ours, so
both engines read the same token stream).

The `.idx` layout (megatron-core `indexed_dataset._IndexWriter`, little endian):
    b"MMIDIDX\\x00\\x00"          9-byte header
    uint64 1                      version
    uint8 dtype code              1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    uint64 sequence count         one sequence per document here
    uint64 document count + 1     the length of the document index below
    int32[sequences]              tokens per sequence
    int64[sequences]              byte offset of each sequence in the .bin
    int64[documents + 1]          document index: sequence numbers where documents start, then the count

Each pretraining source becomes one dataset prefix; the blend weights go into Megatron-Bridge's
`blend` (engines/megatron/translate.py). `write_indexed_dir` builds the whole directory
through data.atomic.building (a crash leaves no half dataset under the final name).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from stagewise.data.atomic import building
from stagewise.data.shards import TokenShard

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.int8): 2, np.dtype(np.int16): 3, np.dtype(np.int32): 4,
               np.dtype(np.int64): 5, np.dtype(np.float64): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 8}
"""megatron-core's DType codes."""


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


def write_indexed(shard: TokenShard, prefix: Path) -> Path:
    """Write `shard` as `<prefix>.bin` + `<prefix>.idx`; the prefix (what Megatron's blend names)."""
    prefix = Path(prefix)
    tokens = np.asarray(shard.tokens)
    if tokens.dtype == np.uint32:  # our wide shards (vocabularies over 65,535); Megatron has int32
        tokens = tokens.astype(np.int32)
    prefix.with_name(prefix.name + ".bin").write_bytes(tokens.astype(tokens.dtype.newbyteorder("<")).tobytes())
    prefix.with_name(prefix.name + ".idx").write_bytes(index_bytes(shard.doc_offsets, tokens.dtype))
    return prefix


def write_indexed_dir(shards: dict[str, TokenShard], out_dir: Path) -> dict[str, Path]:
    """Every shard as `<out_dir>/<name>.bin|.idx`, the directory published atomically; name -> prefix.

    An existing complete directory is reused (its name is content-addressed by the caller)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        with building(out_dir) as tmp:
            for name, shard in shards.items():
                write_indexed(shard, tmp / name)
    return {name: out_dir / name for name in shards}


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
