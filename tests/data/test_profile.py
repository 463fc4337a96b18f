"""data/profile.py and data/profile_warnings.py: figures against hand-counted small files, warnings on
skewed and balanced data, bad lines named by file:line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stagewise.data.errors import BadInput
from stagewise.data.profile import (
    LengthStats,
    build_profile,
    detect_kind,
    pack_limits,
    profile_conversations,
    profile_curated,
    profile_file,
    profile_texts,
)
from stagewise.data.sft_config import CurateConfig, SFTDataSource

TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def call(name: str, args: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str, reasoning: str | None = None, calls: list | None = None) -> dict:
    m = {"role": "assistant", "content": text}
    if reasoning:
        m["reasoning_content"] = reasoning
    if calls:
        m["tool_calls"] = calls
    return m


# Hand-counted: messages 2, 5, 5, 4; assistant turns 1, 2, 2, 2; reasoning traces 4 (of 7 assistant
# turns); tool calls calculator 2 + search 1, in 2 conversations; domains math 2, tools 1, chat 1.
FOUR = [
    {"domain": "math", "messages": [user("What is 2 + 3?"), assistant("5", "two plus three is five")]},
    {"domain": "math", "tools": [TOOL], "messages": [
        {"role": "system", "content": "Be exact."}, user("Compute 123 * 45."),
        assistant("", "the calculator is exact", [call("calculator", {"expression": "123 * 45"})]),
        {"role": "tool", "content": "5535"}, assistant("5535")]},
    {"domain": "tools", "tools": [TOOL, SEARCH], "messages": [
        user("Find the capital of Norway and add 1 + 1."),
        assistant("", None, [call("search", {"q": "capital of Norway"}), call("calculator", {"expression": "1 + 1"})]),
        {"role": "tool", "content": "Oslo"}, {"role": "tool", "content": "2"}, assistant("Oslo, and 2."),
        ]},
    {"domain": "chat", "messages": [user("Hello there."), assistant("Hi.", "a greeting"), user("How are you?"),
                                    assistant("Well, thanks.", "a polite question")]},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- stats

def test_length_stats_by_hand():
    s = LengthStats.of([3, 1, 4, 2, 100])
    assert (s.count, s.mean, s.p50, s.p90, s.p99, s.max) == (5, 22.0, 3, 100, 100, 100)
    assert s.hist_edges == [1, 2, 4, 8, 16, 32, 64, 128] and s.hist_counts == [1, 2, 1, 0, 0, 0, 1]
    ten = LengthStats.of(list(range(1, 11)))
    assert (ten.p50, ten.p90, ten.p99) == (5, 9, 10)  # nearest rank: ceil(q n / 100)
    assert LengthStats.of([]).count == 0


def test_conversation_figures_by_hand(chat_tokenizer):
    from stagewise.data.chat import render

    p = profile_conversations("four", "four.jsonl", FOUR, chat_tokenizer)
    assert p.conversations == 4 and p.domains == {"chat": 1, "math": 2, "tools": 1}
    assert (p.messages.mean, p.messages.p50, p.messages.max) == (4.0, 4, 5)
    assert (p.assistant_turns.count, p.assistant_turns.mean, p.assistant_turns.max) == (4, 1.75, 2)
    traces = ["two plus three is five", "the calculator is exact", "a greeting", "a polite question"]
    assert p.reasoning_tokens.count == 4 and p.reasoning_turn_share == pytest.approx(4 / 7, abs=1e-6)
    by_hand = [len(chat_tokenizer(t, add_special_tokens=False)["input_ids"]) for t in traces]
    assert p.reasoning_tokens.max == max(by_hand) and p.reasoning_tokens.mean == pytest.approx(np.mean(by_hand))
    assert p.tools.per_tool == {"calculator": 2, "search": 1} and p.tools.calls == 3 and p.tools.conversations == 2
    assert p.tools.top_tool == "calculator" and p.tools.top_share == pytest.approx(2 / 3, abs=1e-6)
    rendered = sorted(len(render(c, chat_tokenizer)[0]) for c in FOUR)  # what packing sees
    assert (p.tokens.max, p.tokens.p50) == (rendered[-1], rendered[1])
    assert p.tokens.mean == pytest.approx(np.mean(rendered), abs=1e-3)


def test_domains_pool_sources_and_the_recipe_domain_wins(chat_tokenizer):
    a = profile_conversations("a", "a.jsonl", FOUR, chat_tokenizer, domain="mixed")
    b = profile_conversations("b", "b.jsonl", FOUR[:1], chat_tokenizer)
    report = build_profile([], [a, b], "tok")
    shares = {d.domain: (d.conversations, d.conversation_share, d.sources) for d in report.domains}
    assert shares == {"mixed": (4, 0.8, ["a"]), "math": (1, 0.2, ["b"])}
    assert sum(d.token_share for d in report.domains) == pytest.approx(1.0, abs=1e-5)
    assert report.tools.per_tool == {"calculator": 2, "search": 1}


def test_text_figures_by_hand(chat_tokenizer):
    docs = ["a b c d a b c d", "one two three four five six", "one two three four five six", "x"]
    p = profile_texts("t", "t.jsonl", iter(docs), chat_tokenizer, limits={"seq": 3})
    # 4-grams: 5 with 4 distinct (0.2), 3 distinct (0), 3 distinct (0), none (0)
    assert p.documents == 4 and p.repetition == pytest.approx(0.05)
    assert p.near_duplicate_rate == 0.25  # the second copy of doc 2
    lengths = [len(chat_tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs]
    assert p.tokens.max == max(lengths) and p.over_limit == {"seq": sum(n > 3 for n in lengths)}
    limited = profile_texts("t", "t.jsonl", iter(docs), chat_tokenizer, limit=2)
    assert limited.documents == 2 and limited.limited
    assert not profile_texts("t", "t.jsonl", iter(docs), chat_tokenizer, limit=4).limited


def test_pack_limits_are_the_substages_that_weigh_the_domain():
    subs = [SimpleNamespace(name="one", seq_length=256, blend=SimpleNamespace(weights={"math": 1, "chat": 0})),
            SimpleNamespace(name="two", seq_length=1024, blend=SimpleNamespace(weights={"chat": 2}))]
    assert pack_limits(subs, "math") == {"one": 256}
    assert pack_limits(subs, "chat") == {"two": 1024}
    assert pack_limits(subs, "other") == {}


# --------------------------------------------------------------------------- warnings

def _codes(report) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for w in report.warnings:
        out.setdefault(w.code, []).append(w.subject)
    return out


def _calls(names: list[str]) -> list[dict]:
    return [{"tools": [TOOL, SEARCH], "messages": [user(f"question {i} about {n}"),
                                                  assistant("", None, [call(n, {"i": i})]),
                                                  {"role": "tool", "content": "ok"}, assistant(f"done {i}")]}
            for i, n in enumerate(names)]


def test_tool_warning_fires_on_skew_only(chat_tokenizer):
    skewed = build_profile([], [profile_conversations("s", "s", _calls(["calculator"] * 3 + ["search"]), chat_tokenizer)], "t")
    w = [w for w in skewed.warnings if w.code == "tool_share"]
    assert len(w) == 1 and w[0].subject == "calculator" and w[0].value == 0.75 and "75%" in w[0].message
    balanced = build_profile([], [profile_conversations("b", "b", _calls(["calculator", "search"] * 2), chat_tokenizer)], "t")
    assert "tool_share" not in _codes(balanced)


def test_domain_warnings_fire_on_skew_only(chat_tokenizer):
    short = [{"messages": [user(f"q{i}"), assistant(f"a{i}")]} for i in range(4)]
    long = [{"messages": [user("word " * 200 + str(i)), assistant("ok")]} for i in range(2)]
    skewed = build_profile([], [profile_conversations("s", "s", short[:3], chat_tokenizer, domain="short"),
                                profile_conversations("l", "l", long[:1], chat_tokenizer, domain="long")], "t")
    codes = _codes(skewed)
    assert codes["domain_conversations_share"] == ["short"] and codes["domain_tokens_share"] == ["long"]
    balanced = build_profile([], [profile_conversations("s", "s", short[:2], chat_tokenizer, domain="a"),
                                  profile_conversations("t", "t", short[2:], chat_tokenizer, domain="b")], "t")
    assert not {"domain_conversations_share", "domain_tokens_share"} & set(_codes(balanced))
    alone = build_profile([], [profile_conversations("s", "s", short, chat_tokenizer, domain="a")], "t")
    assert not _codes(alone)  # one domain is a choice, not a skew


def test_length_warning_names_the_limit_and_the_share_over_it(chat_tokenizer):
    convs = [{"messages": [user("word " * n), assistant("ok")]} for n in (1, 2, 3, 300)]
    p = profile_conversations("c", "c", convs, chat_tokenizer, limits={"one": 100, "two": 10_000})
    w = [w for w in build_profile([], [p], "t").warnings if w.code == "length_over_limit"]
    assert [x.subject for x in w] == ["c@one"] and w[0].threshold == 100 and w[0].value == p.tokens.p99
    assert "1 of 4 (25.0%)" in w[0].message and p.over_limit == {"one": 1, "two": 0}


def test_repetition_and_near_duplicate_warnings(chat_tokenizer):
    loops = ["again and again " * 20 + str(i) for i in range(5)]
    fresh = [f"document {i} says something new about topic {i * 7} today" for i in range(20)]
    copies = fresh[:10] + [fresh[0] + " ", fresh[1], fresh[2]]
    report = build_profile([profile_texts("loops", "l", loops, chat_tokenizer),
                            profile_texts("fresh", "f", fresh, chat_tokenizer),
                            profile_texts("copies", "c", copies, chat_tokenizer)], [], "t")
    codes = _codes(report)
    assert codes == {"repetition": ["loops"], "near_duplicates": ["copies"]}
    copies_rate = next(s.near_duplicate_rate for s in report.text_sources if s.name == "copies")
    assert copies_rate == pytest.approx(3 / 13, abs=1e-6)


# --------------------------------------------------------------------------- files

def test_conversation_file_is_curated_and_rejects_counted(tmp_path, chat_tokenizer):
    rows = [*FOUR, '{"messages": [', FOUR[0], {"messages": [user("hi")]}]
    report = profile_file(write_jsonl(tmp_path / "c.jsonl", rows), chat_tokenizer, "tok", {"seq_length": 8})
    (src,) = report.sft_sources
    assert src.conversations == 4 and src.curation.total == 7
    assert src.curation.rejected == {"exact_duplicate": 1, "malformed_json": 1, "role_order": 1}
    assert src.curation.duplicate_rate == pytest.approx(1 / 7, abs=1e-6)
    codes = _codes(report)
    assert codes["reject_rate"] == ["c"] and codes["near_duplicates"] == ["c"] and codes["length_over_limit"] == ["c@seq_length"]


def test_text_file_and_kind_detection(tmp_path, chat_tokenizer):
    texts = write_jsonl(tmp_path / "t.jsonl", ["", {"text": "hello world"}, {"text": "more text here"}])
    assert detect_kind(texts) == "text"
    assert detect_kind(write_jsonl(tmp_path / "c.jsonl", ["not json", FOUR[0]])) == "conversations"
    report = profile_file(texts, chat_tokenizer, "tok")
    assert report.text_sources[0].documents == 2 and not report.sft_sources


@pytest.mark.parametrize("rows, where", [
    ([{"text": "fine"}, {"text": "fine too"}, "{broken"], "bad.jsonl:3"),
    ([{"text": "fine"}, {"body": "no text field"}], "bad.jsonl:2"),
    (["not json at all", "[1, 2]"], "bad.jsonl:1"),
    ([], "bad.jsonl: no lines"),
])
def test_bad_lines_name_file_and_line(tmp_path, chat_tokenizer, rows, where):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(BadInput, match=where.replace(".", r"\.")):
        profile_file(path, chat_tokenizer, "tok")


def test_curated_directory_is_read_with_its_reports(tmp_path, chat_tokenizer):
    from stagewise.data.sft_assembly import curate_sources

    raw = {"a": write_jsonl(tmp_path / "a.jsonl", FOUR[:2]), "b": write_jsonl(tmp_path / "b.jsonl", [*FOUR[2:], FOUR[2]])}
    sources = [SFTDataSource(name="a", path="a.jsonl"), SFTDataSource(name="b", path="b.jsonl", domain="a")]
    out = tmp_path / "curated"
    out.mkdir()
    curate_sources(raw, sources, CurateConfig(max_reject_rate=0.5), out)
    subs = [SimpleNamespace(name="one", seq_length=64, blend=SimpleNamespace(weights={"a": 1}))]
    a, b = profile_curated(out, sources, chat_tokenizer, subs)
    assert (a.conversations, b.conversations) == (2, 2) and b.domains == {"a": 2} and b.limits == {"one": 64}
    assert b.curation.rejected == {"exact_duplicate": 1} and b.curation.report == str(out / "b.report.json")
    assert build_profile([], [a, b], "t").domains[0].conversations == 4


def test_find_prepared_is_none_until_prepared(tmp_path):
    from stagewise.data.config import DataConfig, SourceConfig, TokenizerConfig
    from stagewise.data.prepare import find_prepared, prepare_data

    write_jsonl(tmp_path / "s.jsonl", [{"text": f"document number {i} with some words"} for i in range(40)])
    data = DataConfig(sources=[SourceConfig(name="s", path="s.jsonl")])
    tok = TokenizerConfig(vocab_size=300)
    assert find_prepared(data, tok, tmp_path / "w", 0, tmp_path) is None
    prepared = prepare_data(data, tok, tmp_path / "w", 0, tmp_path, progress=False)
    assert find_prepared(data, tok, tmp_path / "w", 0, tmp_path).root == prepared.root
    assert find_prepared(data, tok, tmp_path / "w", 1, tmp_path) is None  # another seed, other data
