"""curate(): every planted fault caught for its reason, rejects file, no crashes, reject-rate error."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from stagewise.data.curate import CHECKS, CurationError, curate
from stagewise.data.sft_config import CurateConfig
from stagewise.data.world.conversations import dirty_lines, domain_conversations


@pytest.fixture(scope="module")
def dirty():
    clean = domain_conversations("lookup", 30, 5) + domain_conversations("arithmetic", 30, 5)
    return clean, dirty_lines(clean, seed=0)


def test_planted_faults_rejected_for_their_reason(dirty, tmp_path):
    clean, lines = dirty
    report = curate([line for line, _ in lines], CurateConfig(), tmp_path / "rejects.jsonl", source="dirty")
    planted = Counter(r for _, r in lines if r)
    assert report.rejected == dict(planted)
    assert [c["id"] for c in report.kept] == [json.loads(line)["id"] for line, r in lines if r is None]
    rejects = [json.loads(row) for row in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert [(row["line"], row["reason"]) for row in rejects] == [(i, r) for i, (_, r) in enumerate(lines, 1) if r]
    assert all(row["raw"] == lines[row["line"] - 1][0] and row["source"] == "dirty" and row["detail"] for row in rejects)
    assert report.checked["structure"] == report.total == len(lines)
    assert list(report.checked) == list(CHECKS)
    assert report.checked["near_dedup"] == len(clean) + planted["near_duplicate"]


def test_bad_lines_never_crash(tmp_path):
    path = tmp_path / "mess.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    path.write_bytes(b"\n".join([good.encode(), b"\xff\xfe\x00garbage", b"", b"   ", b"{", b"null", b"42",
                                 json.dumps({"messages": [None]}).encode(), json.dumps({"messages": {"a": 1}}).encode()]))
    report = curate(path, CurateConfig(max_reject_rate=1.0), tmp_path / "r.jsonl")
    assert report.source == "mess" and report.total == 7 and len(report.kept) == 1  # blank lines skipped
    assert report.rejected == {"malformed_json": 4, "bad_schema": 2}
    lines = [json.loads(row)["line"] for row in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert lines == [2, 5, 6, 7, 8, 9]


def test_reject_rate_error_names_source_and_rate(tmp_path):
    lines = ["not json"] * 3 + [json.dumps({"messages": [{"role": "user", "content": "q"},
                                                          {"role": "assistant", "content": "a"}]})]
    with pytest.raises(CurationError) as e:
        curate(lines, CurateConfig(max_reject_rate=0.5), tmp_path / "r.jsonl", source="web")
    assert "'web'" in str(e.value) and "75.0%" in str(e.value) and "malformed_json 3" in str(e.value)
    assert e.value.rate == 0.75
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 3  # rejects are written anyway
    assert len(curate(lines, CurateConfig(), None, max_reject_rate=0.8).kept) == 1


def test_length_limits(chat_tokenizer):
    long = {"messages": [{"role": "user", "content": "word " * 400}, {"role": "assistant", "content": "ok"}]}
    short = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    lines = [json.dumps(long), json.dumps(short)]
    assert curate(lines, CurateConfig(max_chars=1000)).rejected == {"too_long_chars": 1}
    cfg = CurateConfig(max_chars=None, max_tokens=100)
    assert curate(lines, cfg).rejected == {}  # token limit needs a tokenizer
    assert curate(lines, cfg, tokenizer=chat_tokenizer).rejected == {"too_long_tokens": 1}


def test_dedup_can_be_switched_off():
    conv = json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    assert curate([conv, conv], CurateConfig()).rejected == {"exact_duplicate": 1}
    report = curate([conv, conv], CurateConfig(exact_dedup=False, near_dedup=False))
    assert len(report.kept) == 2 and report.checked["near_dedup"] == 0
