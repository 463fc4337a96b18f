"""build_corpus in process: what it keeps and rejects, the shards megatron reads, resuming, refusing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from stagewise.data.corpus.build import build_corpus, near_drops
from stagewise.data.corpus.config import CorpusBuildConfig
from stagewise.data.errors import BadInput
from stagewise.data.indexed_format import read_indexed

VAL = 0.1


def build(corpus, tok, out, **cfg):
    return build_corpus(corpus.sources, corpus.base, None, tok, CorpusBuildConfig(**cfg), VAL, 7, out)


def token_docs(tok_dir, texts) -> list[tuple[int, ...]]:
    """Each text as the tokenizer's HF wrapper encodes it, eos appended (not the build's encoder)."""
    tok = AutoTokenizer.from_pretrained(tok_dir)
    return [tuple(tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]) for t in texts]


def read_split(out: Path, manifest: dict, source: str, split: str) -> list[tuple[int, ...]]:
    return [tuple(d.tolist()) for shard in manifest["sources"][source][split]
            for d in read_indexed(out / shard["prefix"])]


def is_val(text: str) -> bool:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64 < VAL


def all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".work" not in p.parts and p.name != "build_report.json"}


def test_keeps_the_first_copy_corpus_wide_and_counts_rejects_by_reason(corpus, corpus_tokenizer, tmp_path):
    result = build(corpus, corpus_tokenizer, tmp_path / "out", shard_mb=0.002)
    m = result.manifest
    assert result.report["units"] > 6  # several units per file: dedup must see across them
    for name in ("web", "books"):
        s = m["sources"][name]
        assert s["docs"] == corpus.docs[name]
        assert s["rejected"] == corpus.rejected[name]
        assert s["duplicates"] == corpus.duplicates[name]
        assert s["kept"] == len(corpus.expected[name])
        train = read_split(tmp_path / "out", m, name, "train")
        val = read_split(tmp_path / "out", m, name, "val")
        want_val = token_docs(corpus_tokenizer, [t for t in corpus.expected[name] if is_val(t)])
        want_train = token_docs(corpus_tokenizer, [t for t in corpus.expected[name] if not is_val(t)])
        assert sorted(val) == sorted(want_val) and want_val
        assert sorted(train) == sorted(want_train)
        assert s["train_tokens"] == sum(map(len, train)) and s["val_tokens"] == sum(map(len, val))
    assert corpus.duplicates == {"web": {"exact": 2, "near": 1}, "books": {"exact": 1, "near": 1}}


@pytest.mark.parametrize(("pairs", "exact", "near"), [
    ({(0, 1, 0, 2), (0, 2, 0, 3)}, {}, {(0, 2)}),             # a ~ b ~ c, a !~ c: b goes, c stays (b is not kept)
    ({(0, 1, 0, 2), (0, 1, 1, 0)}, {}, {(0, 2), (1, 0)}),      # both later partners of a kept one go
    ({(0, 1, 0, 2)}, {(0, 1): "exact"}, set()),               # an exact duplicate drops nothing
    ({(0, 1, 2, 0), (1, 5, 2, 0)}, {(0, 1): "exact"}, {(2, 0)}),  # ... but another kept partner does
])
def test_near_drops_follow_the_streaming_rule_in_plan_order(pairs, exact, near):
    assert set(near_drops(pairs, exact)) == near


def test_what_is_kept_does_not_depend_on_how_the_inputs_are_cut(corpus, corpus_tokenizer, tmp_path):
    fine = build(corpus, corpus_tokenizer, tmp_path / "fine", shard_mb=0.001)
    whole = build(corpus, corpus_tokenizer, tmp_path / "whole", shard_mb=64)
    assert fine.report["units"] > 10 and whole.report["units"] == 5  # 4 JSONL files, 1 parquet file
    for name in ("web", "books"):
        for split in ("train", "val"):
            assert (sorted(read_split(tmp_path / "fine", fine.manifest, name, split))
                    == sorted(read_split(tmp_path / "whole", whole.manifest, name, split)))


def test_a_rerun_redoes_only_unfinished_units_and_ends_byte_identical(corpus, corpus_tokenizer, tmp_path):
    out = tmp_path / "out"
    first = build(corpus, corpus_tokenizer, out, shard_mb=0.004)
    before = all_files(out)
    # a crash: two units' write records and one unit's shards gone, a half-written temporary left behind
    records = sorted((out / ".work" / "done").iterdir())
    for r in records[1:3]:
        r.unlink()
    for f in (out / "shards" / "web" / "train").glob("part-00002.*"):
        f.unlink()
    (out / "shards" / "web" / "train" / ".part-00002.bin.tmp-999").write_bytes(b"half")
    (out / "corpus.json").unlink()
    again = build(corpus, corpus_tokenizer, out, shard_mb=0.004)
    assert again.report["units_written_before"] == first.report["units"] - 2
    assert again.report["units_written_now"] == 2
    after = all_files(out)
    after.pop("shards/web/train/.part-00002.bin.tmp-999")
    assert after == before


def test_the_shards_are_megatron_indexed_datasets_with_the_manifests_counts(corpus, corpus_tokenizer, tmp_path):
    result = build(corpus, corpus_tokenizer, tmp_path / "out", shard_mb=0.004)
    for name, s in result.manifest["sources"].items():
        for split in ("train", "val"):
            for shard in s[split]:
                prefix = tmp_path / "out" / shard["prefix"]
                idx = prefix.with_name(prefix.name + ".idx").read_bytes()
                assert idx[:9] == b"MMIDIDX\x00\x00" and idx[17] == 8  # uint16 tokens: a 500-token vocabulary
                n = int.from_bytes(idx[18:26], "little")
                assert n == shard["docs"]
                sizes = np.frombuffer(idx, "<i4", n, 34)
                assert int(sizes.sum()) == shard["tokens"] == prefix.with_name(prefix.name + ".bin").stat().st_size // 2


def test_a_directory_holding_another_plan_is_refused(corpus, corpus_tokenizer, tmp_path):
    out = tmp_path / "out"
    build(corpus, corpus_tokenizer, out)
    with (corpus.base / "web" / "part-001.jsonl").open("a") as f:
        f.write(json.dumps({"text": "one more document arrives later"}) + "\n")
    with pytest.raises(BadInput, match="another plan.*part-001.jsonl"):
        build(corpus, corpus_tokenizer, out)
    other = tmp_path / "other"
    build(corpus, corpus_tokenizer, other, shard_mb=64)
    with pytest.raises(BadInput, match="another plan"):  # the same inputs, other filters: other output
        build(corpus, corpus_tokenizer, other, shard_mb=64, filters={"min_words": 1})
