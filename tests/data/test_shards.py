"""Shards: eos-terminated documents, hash-based val split, seeded shuffle, dtype and atomic writes."""

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from stagewise.data.config import TokenizerConfig
from stagewise.data.shards import TokenShard, split_docs, stable_fraction, token_dtype, write_shard, write_source_shards
from stagewise.data.tokenizer import build_tokenizer

DOCS = [f"Document number {i} says {'hello ' * (i % 7)}and ends." for i in range(200)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    build_tokenizer(TokenizerConfig(vocab_size=320), {"a": lambda: DOCS}, out.parent, out)
    return AutoTokenizer.from_pretrained(out)


def _decoded(tok, shard):
    return [tok.decode(shard.doc(i)[:-1]) for i in range(shard.n_docs)]


def test_source_shards_content(tok, tmp_path):
    s = write_source_shards(DOCS, tok, tmp_path / "src", validation_fraction=0.1, seed=1, name="src")
    train, val = TokenShard.open(s.train), TokenShard.open(s.val)
    assert (s.docs, s.train_tokens, s.val_tokens) == (200, train.n_tokens, val.n_tokens)
    assert train.n_docs + val.n_docs == 200 and 0 < val.n_docs < 60
    assert train.tokens.dtype == np.uint16 and isinstance(train.tokens, np.memmap)
    for shard in (train, val):
        ends = shard.doc_offsets[1:] - 1
        assert (shard.tokens[ends] == tok.eos_token_id).all()
        assert (shard.tokens == tok.eos_token_id).sum() == shard.n_docs  # eos only at document ends
    assert sorted(_decoded(tok, train) + _decoded(tok, val)) == sorted(DOCS)
    assert set(_decoded(tok, val)) == {d for d in DOCS if stable_fraction(d) < 0.1}
    meta = json.loads((s.train / "meta.json").read_text())
    assert meta["n_docs"] == train.n_docs and meta["eos_id"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_shuffle_is_seeded_and_val_does_not_depend_on_seed(tok, tmp_path):
    a = write_source_shards(DOCS, tok, tmp_path / "a", 0.1, seed=1, name="x")
    b = write_source_shards(DOCS, tok, tmp_path / "b", 0.1, seed=1, name="x")
    c = write_source_shards(DOCS, tok, tmp_path / "c", 0.1, seed=2, name="x")
    read = lambda p: (p / "tokens.bin").read_bytes()  # noqa: E731
    assert read(a.train) == read(b.train) and read(a.train) != read(c.train)
    assert read(a.val) == read(c.val)
    assert _decoded(tok, TokenShard.open(a.train)) != [d for d in DOCS if stable_fraction(d) >= 0.1]


def test_special_token_text_stays_text(tok, tmp_path):
    s = write_source_shards(["a literal <|eos|> and <|im_start|> inside", "second"], tok, tmp_path / "s", 0.0, 1, "s")
    shard = TokenShard.open(s.train)
    assert (shard.tokens == tok.eos_token_id).sum() == 2 and 3 not in shard.tokens


def test_split_rules():
    f = np.array([0.5, 0.7, 0.9])
    assert split_docs(f, 0.1).tolist() == [True, False, False]  # at least one val doc (lowest hash)
    assert split_docs(f, 0.0).tolist() == [False, False, False]
    assert split_docs(np.array([0.05]), 0.1).tolist() == [False]  # one doc stays in train
    assert split_docs(np.array([0.01, 0.02]), 0.1).tolist() == [True, False]  # train keeps one


def test_dtype_and_uint32_round_trip(tmp_path):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    docs = [np.array([70000, 5, 2]), np.array([2])]
    shard = write_shard(tmp_path / "big", docs, vocab_size=100_000, eos_id=2)
    assert shard.tokens.dtype == np.uint32 and shard.tokens.tolist() == [70000, 5, 2, 2]
    assert shard.doc_offsets.tolist() == [0, 3, 4]
    empty = write_shard(tmp_path / "empty", [], vocab_size=10, eos_id=2)
    assert TokenShard.open(empty.path).n_tokens == 0


def test_failed_write_leaves_nothing(tok, tmp_path):
    def texts():
        yield "fine"
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_source_shards(texts(), tok, tmp_path / "s", 0.1, 1, "s")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="no documents"):
        write_source_shards([], tok, tmp_path / "s", 0.1, 1, "s")
