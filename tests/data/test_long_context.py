"""Long-context batches: exact token budgets, length and source shares by tokens, whole
documents (never padding), micro-batches of one length, determinism and exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from stagewise.data.long_context import LongContextBatches, assign_sources, length_counts, long_context_blend
from stagewise.data.long_context_config import LongContextDataConfig
from stagewise.data.shards import write_shard

EOS = 2


def _shard(path, doc_lengths, first_id):
    """Document g (global id first_id + i) is [g, g, ..., eos]: its pieces are recognisable."""
    docs = [np.append(np.full(n - 1, first_id + i), EOS) for i, n in enumerate(doc_lengths)]
    return write_shard(path, docs, vocab_size=100_000, eos_id=EOS)


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(0)
    return {  # every document shorter than the shortest row (65 tokens): none may be cut
        "doc_qa": _shard(tmp_path / "dq", rng.integers(20, 60, 300), 10_000),
        "retrieval": _shard(tmp_path / "r", rng.integers(5, 40, 300), 20_000),
        "facts": _shard(tmp_path / "f", rng.integers(3, 30, 500), 30_000),
    }


def _cfg(**kw) -> LongContextDataConfig:
    base = {"lengths": [{"length": 256, "share": 0.4}, {"length": 128, "share": 0.4}, {"length": 64, "share": 0.2}],
            "global_batch_tokens": 1024, "micro_batch_tokens": 256, "lookahead_docs": 16, "phase2_blend": {"facts": 1}}
    return LongContextDataConfig(**(base | kw))


def _doc_lengths(shards) -> dict[int, int]:
    out = {}
    for shard in shards.values():
        for i in range(shard.n_docs):
            doc = shard.doc(i)
            out[int(doc[0])] = len(doc)
    return out


def _pieces(row: np.ndarray) -> list[tuple[int, int, bool]]:
    """(document id, tokens, ends with eos) for each run of one document in a row."""
    out, start = [], 0
    for i in range(1, len(row) + 1):
        if i == len(row) or row[i - 1] == EOS or (row[i] != row[i - 1] and row[i] != EOS):
            ids = row[start:i][row[start:i] != EOS]
            out.append((int(ids[0]) if len(ids) else -1, i - start, row[i - 1] == EOS))
            start = i
    return out


def test_every_step_spends_exactly_the_token_budget_in_equal_length_micro_batches(shards):
    cfg = _cfg()
    batches = LongContextBatches(shards, cfg, long_context_blend(cfg), seed=0)
    for _ in range(20):
        batch = batches.next_batch()
        assert batch.tokens == 1024 == sum(mb.shape[0] * (mb.shape[1] - 1) for mb in batch.micro_batches)
        for mb in batch.micro_batches:
            assert mb.shape[0] <= max(1, 256 // (mb.shape[1] - 1))
        assert batch.lengths == sorted(batch.lengths, reverse=True)


def test_length_and_source_shares_are_by_tokens_within_one_sequence(shards):
    cfg = _cfg()
    blend = long_context_blend(cfg)
    batches = LongContextBatches(shards, cfg, blend, seed=0)
    steps = 60
    for _ in range(steps):
        batches.next_batch()
    r, total = batches.realized(), steps * 1024
    for length, share in ((256, 0.4), (128, 0.4), (64, 0.2)):
        assert abs(r["lengths"][length] - share * total) <= 256, r["lengths"]
    for name, weight in blend.items():
        assert abs(r["sources"][name] - weight * total) <= 256, (name, r["sources"])
    assert blend == pytest.approx({"doc_qa": 0.2, "facts": 0.79, "retrieval": 0.01})


def test_documents_are_kept_whole_and_nothing_is_padding(shards):
    cfg = _cfg()
    batches = LongContextBatches(shards, cfg, long_context_blend(cfg), seed=0)
    lengths, filler = _doc_lengths(shards), 0
    for _ in range(30):
        for mb in batches.next_batch().micro_batches:
            for row in mb.numpy():
                assert (row != 0).all()  # no pad id anywhere
                pieces = _pieces(row)
                for doc, n, ends in pieces[:-1]:
                    assert ends and n == lengths[doc]  # every piece but the last: a whole document
                doc, n, ends = pieces[-1]
                if n != lengths[doc]:  # the last: whole, or a repeated prefix (filler)
                    assert not ends
                    filler += n
    r = batches.realized()
    assert r["cut_documents"] == 0 and r["filler_tokens"] == filler
    assert filler < 0.05 * 30 * 1024


def test_a_document_longer_than_the_row_is_cut_and_continues_in_order(tmp_path):
    long_doc = _shard(tmp_path / "long", [700, 10, 12, 9], 40_000)
    cfg = _cfg(doc_qa_share=0.0, retrieval_share=0.0, phase2_blend={"long": 1}, lookahead_docs=4)
    batches = LongContextBatches({"long": long_doc}, cfg, long_context_blend(cfg), seed=0)
    seen = []
    for _ in range(3):
        for mb in batches.next_batch().micro_batches:
            for row in mb.numpy():
                seen += [n for doc, n, _ in _pieces(row) if doc == 40_000]
    assert batches.realized()["cut_documents"] > 0
    assert sum(seen) >= 700  # the 700-token document was served in pieces


def test_same_seed_same_batches_other_seed_other_order(shards):
    cfg = _cfg()
    blend = long_context_blend(cfg)
    a, b, c = (LongContextBatches(shards, cfg, blend, seed=s) for s in (1, 1, 2))
    for _ in range(5):
        ma, mb, mc = a.next_batch().micro_batches, b.next_batch().micro_batches, c.next_batch().micro_batches
        assert all(np.array_equal(x, y) for x, y in zip(ma, mb))
    assert not all(np.array_equal(x, y) for x, y in zip(ma, mc))


def test_exact_resume_from_a_json_state(shards):
    cfg = _cfg()
    blend = long_context_blend(cfg)
    straight = LongContextBatches(shards, cfg, blend, seed=3)
    for _ in range(4):
        straight.next_batch()
    state = json.loads(json.dumps(straight.state_dict()))
    expected = [straight.next_batch().micro_batches for _ in range(6)]
    resumed = LongContextBatches(shards, cfg, blend, seed=3)
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_batch().micro_batches
        assert len(got) == len(want) and all(np.array_equal(x, y) for x, y in zip(got, want))
    assert resumed.realized() == straight.realized()
    other = LongContextBatches(shards, cfg, blend, seed=4)
    with pytest.raises(ValueError, match="cannot resume"):
        other.load_state_dict(state)


def test_length_counts_fill_exactly_and_carry():
    carry: dict = {}
    totals = {64: 0, 256: 0}
    for _ in range(10):
        counts, carry = length_counts({256: 0.75, 64: 0.25}, 320, carry)
        assert sum(n * c for n, c in counts.items()) == 320
        for n, c in counts.items():
            totals[n] += n * c
    assert abs(totals[256] - 0.75 * 3200) <= 256 and abs(totals[64] - 0.25 * 3200) <= 256


def test_assign_sources_longest_first_to_the_most_due():
    owners, carry = assign_sources([256, 64, 64], {"a": 0.5, "b": 0.5}, 384, {})
    assert owners == ["a", "b", "b"] and carry == {"a": -64.0, "b": 64.0}


def test_blend_adds_retrieval_inside_phase2_and_refuses_unknown_sources(shards):
    cfg = _cfg(phase2_blend={"facts": 3, "retrieval": 1})
    assert long_context_blend(cfg) == pytest.approx({"doc_qa": 0.2, "facts": 0.5925, "retrieval": 0.01 + 0.1975})
    with pytest.raises(ValueError, match="no shard"):
        LongContextBatches(shards, cfg, {"nope": 1.0}, seed=0)


@pytest.mark.parametrize("bad, message", [
    ({"lengths": [{"length": 100, "share": 1}, {"length": 64, "share": 1}]}, "multiple of the shortest"),
    ({"global_batch_tokens": 200}, "at least the longest"),
    ({"lengths": [{"length": 64, "share": 1}, {"length": 64, "share": 1}]}, "distinct"),
    ({"doc_qa_share": 0.9, "retrieval_share": 0.2}, "<= 1"),
    ({"typo": 1}, "Extra inputs"),
])
def test_config_refuses_geometry_that_cannot_fill_exactly(bad, message):
    with pytest.raises(ValidationError, match=message):
        _cfg(**bad)


def test_doc_qa_shards_feed_the_batches_with_whole_documents(tmp_path):
    from stagewise.data.long_context import prepare_doc_qa
    from stagewise.data.long_context_config import DocQAConfig
    from stagewise.data.shards import TokenShard
    from stagewise.data.tokenizer import train_bpe
    from stagewise.data.world.doc_qa import doc_qa_texts

    dq = DocQAConfig(documents=30, entities=60, min_paragraphs=2, max_paragraphs=5)
    tok = train_bpe(doc_qa_texts(30, 0, 60, 2, 5), 400)
    shards = prepare_doc_qa(tok, tmp_path / "doc_qa", dq, seed=0)
    train = TokenShard.open(shards.train)
    assert shards.docs == 30 and train.n_docs + TokenShard.open(shards.val).n_docs == 30
    longest = max(len(train.doc(i)) for i in range(train.n_docs))
    cfg = _cfg(lengths=[{"length": 1024, "share": 1}], global_batch_tokens=1024, doc_qa_share=1.0,
               retrieval_share=0.0, phase2_blend=None, doc_qa=dq)
    assert longest < 1024
    batches = LongContextBatches({"doc_qa": train}, cfg, long_context_blend(cfg), seed=0)
    row = batches.next_batch().micro_batches[0][0].tolist()
    first = row[: row.index(tok.eos_token_id)]
    assert "\nAnswer: " in tok.decode(first)  # a whole document: question and answer at its end
