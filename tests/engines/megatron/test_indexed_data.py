"""Our shards written as Megatron indexed datasets: the exact .idx bytes, and the documents read back."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from stagewise.data.indexed_format import index_bytes, read_indexed
from stagewise.data.shards import TokenShard
from stagewise.engines.megatron.indexed_data import write_indexed_dir


def _shard(tmp_path, docs, dtype=np.uint16):
    tokens = np.concatenate([np.asarray(d, dtype=dtype) for d in docs])
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return TokenShard(tmp_path, tokens, offsets, {"dtype": np.dtype(dtype).name})


def test_index_bytes_match_the_layout_megatron_core_reads():
    raw = index_bytes(np.array([0, 3, 5]), np.dtype(np.uint16))
    expected = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 2, 3)
                + struct.pack("<ii", 3, 2) + struct.pack("<qq", 0, 6) + struct.pack("<qqq", 0, 1, 2))
    assert raw == expected
    # int32 tokens: code 4 and 4-byte pointers
    assert index_bytes(np.array([0, 3, 5]), np.dtype(np.int32))[17] == 4
    assert struct.unpack("<qq", index_bytes(np.array([0, 3, 5]), np.dtype(np.int32))[42:58]) == (0, 12)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_documents_round_trip(tmp_path, dtype):
    docs = [[5, 6, 7, 0], [9, 0], [1, 2, 3, 4, 5, 0]]
    prefixes = write_indexed_dir({"facts": _shard(tmp_path, docs, dtype)}, tmp_path / "megatron")
    back = read_indexed(prefixes["facts"])
    assert [d.tolist() for d in back] == docs
    assert (tmp_path / "megatron" / "facts.bin").stat().st_size == 12 * np.dtype(dtype).itemsize


def test_bad_offsets_are_refused():
    with pytest.raises(ValueError, match="start at 0"):
        index_bytes(np.array([1, 3]), np.dtype(np.uint16))
    with pytest.raises(ValueError, match="no code"):
        index_bytes(np.array([0, 3]), np.dtype(np.uint32))


def test_wide_vocabulary_shards_become_int32(tmp_path):
    docs = [[131_000, 7, 0], [70_000, 0]]
    prefixes = write_indexed_dir({"web": _shard(tmp_path, docs, np.uint32)}, tmp_path / "megatron")
    assert (tmp_path / "megatron" / "web.idx").read_bytes()[17] == 4
    assert [d.tolist() for d in read_indexed(prefixes["web"])] == docs
