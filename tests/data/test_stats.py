"""Unigram cross-entropy against a hand-computed value on toy shards."""

import math

import numpy as np
import pytest

from stagewise.data.prepare import PreparedData
from stagewise.data.shards import SourceShards, write_shard
from stagewise.data.stats import unigram_cross_entropy


def _prepared(tmp_path, sources: dict[str, tuple[list[list[int]], list[list[int]]]], vocab: int) -> PreparedData:
    shards = {}
    for name, (train, val) in sources.items():
        t = write_shard(tmp_path / name / "train", [np.array(d) for d in train], vocab, eos_id=0)
        v = write_shard(tmp_path / name / "val", [np.array(d) for d in val], vocab, eos_id=0)
        shards[name] = SourceShards(t.path, v.path, t.n_tokens, v.n_tokens, len(train) + len(val))
    return PreparedData(tmp_path, tmp_path, "toy", False, shards, vocab_size=vocab)


def test_unigram_cross_entropy_by_hand(tmp_path):
    # train ids: 1, 1, 2, 0 -> counts [1, 2, 1, 0], N = 4, V = 4 -> p = (c + 1) / 8 = [2, 3, 2, 1] / 8
    # val ids: 1, 3 -> CE = -(ln 3/8 + ln 1/8) / 2
    p = _prepared(tmp_path, {"toy": ([[1, 1, 2, 0]], [[1, 3]])}, vocab=4)
    assert unigram_cross_entropy(p) == pytest.approx((math.log(8 / 3) + math.log(8)) / 2, abs=1e-12)


def test_pools_sources(tmp_path):
    # train pooled: ids 1, 0, 2, 0 -> counts [2, 1, 1], N = 4, V = 3 -> p = [3, 2, 2] / 7; val: 0, 2
    p = _prepared(tmp_path, {"a": ([[1, 0]], [[0]]), "b": ([[2, 0]], [[2]])}, vocab=3)
    assert unigram_cross_entropy(p) == pytest.approx((math.log(7 / 3) + math.log(7 / 2)) / 2, abs=1e-12)


def test_no_validation_tokens(tmp_path):
    p = _prepared(tmp_path, {"a": ([[1, 0]], [])}, vocab=3)
    with pytest.raises(ValueError, match="no validation tokens"):
        unigram_cross_entropy(p)
