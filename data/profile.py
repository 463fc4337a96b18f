"""Data profile: the statistics that show bias in training data before a model trains on it.

The Nemotron teams' advice is "data first": look at length, turn, reasoning and tool
distributions, per source and per domain, before blaming the model. This module measures
them and assembles one report (`DataProfile`, pydantic, JSON-ready):

    texts = profile_texts("stdlib", path, iter_texts(...), tok, limits={"pretrain": 256})
    convs = profile_conversations("calculator", path, kept, tok, curation=report.to_dict(),
                                  domain="calculator", limits={"stage1": 512})
    report = build_profile([texts], [convs], tokenizer="runs/tiny/data/<digest>/tokenizer")
    report.warnings        # skew with the number behind it (data/profile_warnings.py)

- Token lengths: pretraining documents as the tokenizer encodes them (the shards add one eos),
  conversations as the chat template renders them (`data.chat.render_text`: what packing sees).
  Stats are count, mean, nearest-rank p50/p90/p99 (a length that occurs: at least q% of the items
  are no longer) and max, with a log2 histogram for the plot.
- Turns: messages per conversation and assistant turns; reasoning: tokens of each assistant
  turn's `reasoning_content` (the template's `<think>` part) and the share of assistant turns with one;
  tools: calls per tool name (`tool_calls[].function.name`).
- Curation and duplicates come from data/curate (its report for conversations, MinHash
  `near_duplicates` for text); repetition is curation's own measure, `repeated_fraction` of the
  word n-grams (CurateConfig.repeat_ngram, 4), averaged over documents (conversations: the text
  dedup compares, `conversation_text(tools=False)`).
- `profile_file` profiles one JSONL file, telling text rows from conversations by its lines.

Plain Python: no Prefect, no MLflow (tasks/data_profile.py logs it; eval/plots draws it).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, PrivateAttr

from stagewise.data.chat import render_text
from stagewise.data.curate import curate
from stagewise.data.curate.dedup import near_duplicates
from stagewise.data.curate.repetition import repeated_fraction
from stagewise.data.curate.text import conversation_text, words
from stagewise.data.errors import BadInput
from stagewise.data.profile_warnings import ProfileWarning, profile_warnings
from stagewise.data.sft_assembly import read_jsonl
from stagewise.data.sft_config import CurateConfig
from stagewise.data.sources import read_texts

PROFILE_VERSION = 1
"""Bump when a statistic is measured differently (cached profiles are then recomputed)."""
ENCODE_BATCH = 1024
"""Texts per call to the fast tokenizer (batched in Rust; bounded memory)."""


# --------------------------------------------------------------------------- the report

class LengthStats(BaseModel):
    """A distribution of lengths: count, mean, nearest-rank percentiles, max, log2 histogram."""

    count: int = 0
    mean: float = 0.0
    p50: int = 0
    p90: int = 0
    p99: int = 0
    max: int = 0
    hist_edges: list[int] = []
    """Bin edges, powers of two: bin i holds lengths in [edges[i], edges[i+1])."""
    hist_counts: list[int] = []

    @classmethod
    def of(cls, values: Sequence[int]) -> "LengthStats":
        if not len(values):
            return cls()
        v = np.sort(np.asarray(values, dtype=np.int64))
        edges, counts = log2_histogram(v)
        return cls(count=len(v), mean=round(float(v.mean()), 3), p50=nearest_rank(v, 50), p90=nearest_rank(v, 90),
                   p99=nearest_rank(v, 99), max=int(v[-1]), hist_edges=edges, hist_counts=counts)


def nearest_rank(sorted_values: np.ndarray, q: float) -> int:
    """The smallest value with at least q% of the values at or below it (1-based rank ceil(q n / 100))."""
    rank = max(math.ceil(q / 100 * len(sorted_values)), 1)
    return int(sorted_values[rank - 1])


def log2_histogram(values: np.ndarray) -> tuple[list[int], list[int]]:
    """Counts in power-of-two bins covering the values (lengths below 1 fall into the first bin)."""
    v = np.maximum(values, 1)
    lo, hi = int(np.log2(v.min())), int(np.log2(v.max())) + 1
    edges = [2**i for i in range(lo, hi + 1)]
    counts, _ = np.histogram(v, bins=edges)
    return edges, [int(c) for c in counts]


class ToolStats(BaseModel):
    """Tool calls: how many, in how many conversations, per tool name, and the most used tool's share."""

    calls: int = 0
    conversations: int = 0
    """Conversations with at least one tool call."""
    per_tool: dict[str, int] = {}
    top_tool: str | None = None
    top_share: float | None = None

    @classmethod
    def of(cls, per_tool: Mapping[str, int], conversations: int) -> "ToolStats":
        calls = sum(per_tool.values())
        top = max(sorted(per_tool), key=per_tool.__getitem__) if per_tool else None
        return cls(calls=calls, conversations=conversations, per_tool=dict(sorted(per_tool.items())), top_tool=top,
                   top_share=round(per_tool[top] / calls, 6) if top else None)


class CurationStats(BaseModel):
    """What data/curate kept and why it rejected the rest (its report's counts)."""

    total: int
    kept: int
    rejected: dict[str, int]
    reject_rate: float
    duplicate_rate: float | None
    """(exact + near duplicates) / total; None when curation ran no dedup."""
    report: str | None = None
    """The curation report read, when the SFT data step had written one."""

    @classmethod
    def of(cls, summary: Mapping[str, Any], report: str | None = None) -> "CurationStats":
        """From a CurateReport.to_dict() (or the `<name>.report.json` it was written to)."""
        rejected = dict(summary["rejected"])
        checked = summary.get("checked") or {}
        dedup = checked.get("exact_dedup", 0) or checked.get("near_dedup", 0)
        dups = rejected.get("exact_duplicate", 0) + rejected.get("near_duplicate", 0)
        total = summary["total"]
        return cls(total=total, kept=summary["kept"], rejected=rejected, reject_rate=summary["reject_rate"],
                   duplicate_rate=round(dups / total, 6) if dedup and total else None, report=report)


class _Source(BaseModel):
    name: str
    path: str
    tokens: LengthStats
    repetition: float
    """Mean over documents of the share of word n-grams that repeat an earlier one in the same document."""
    limits: dict[str, int] = {}
    """Sequence or pack lengths this source is trained at (label -> tokens)."""
    over_limit: dict[str, int] = {}
    """Items longer than each limit (label -> count)."""


class TextSourceProfile(_Source):
    """A pretraining source (JSONL text rows, parquet or txt through data/sources.py)."""

    kind: Literal["text"] = "text"
    documents: int
    bad_lines: int = 0
    """Lines dropped by `on_bad_line: skip`."""
    limited: bool = False
    """Only the first `limit` documents were profiled."""
    near_duplicate_rate: float
    """Documents that near-duplicate an earlier one (MinHash, curation's threshold) / documents."""


class ConversationSourceProfile(_Source):
    """An SFT source: what curation kept (what trains), and what it rejected."""

    kind: Literal["conversations"] = "conversations"
    conversations: int
    domains: dict[str, int]
    """Conversations per domain (the recipe's source domain, else each conversation's `domain`)."""
    messages: LengthStats
    assistant_turns: LengthStats
    reasoning_tokens: LengthStats
    """Tokens of each assistant turn's reasoning trace (turns with one)."""
    reasoning_turn_share: float
    """Assistant turns with a reasoning trace / assistant turns."""
    tools: ToolStats
    curation: CurationStats | None = None
    _by_domain: dict[str, list[int]] = PrivateAttr(default_factory=dict)


class DomainProfile(BaseModel):
    """Conversations pooled by domain over every SFT source (what the blends weigh)."""

    domain: str
    sources: list[str]
    conversations: int
    conversation_share: float
    tokens: int
    token_share: float
    lengths: LengthStats


class DataProfile(BaseModel):
    """The whole profile: every source, the domains, the tools, and the warnings."""

    version: int = PROFILE_VERSION
    tokenizer: str
    repetition_ngram: int
    text_sources: list[TextSourceProfile] = []
    sft_sources: list[ConversationSourceProfile] = []
    domains: list[DomainProfile] = []
    tools: ToolStats = ToolStats()
    warnings: list[ProfileWarning] = []


# --------------------------------------------------------------------------- measuring

def token_lengths(texts: Sequence[str], tokenizer: Any) -> list[int]:
    """Tokens of each text (no special tokens added), encoded in batches: by the fast tokenizer's Rust
    backend without offsets when there is one (a third faster than the Python call), else the call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    out: list[int] = []
    for i in range(0, len(texts), ENCODE_BATCH):
        batch = list(texts[i:i + ENCODE_BATCH])
        if backend is not None:
            out += [len(e) for e in backend.encode_batch_fast(batch, add_special_tokens=False)]
        else:
            out += [len(ids) for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]]
    return out


def conversation_lengths(convs: Sequence[dict], tokenizer: Any) -> list[int]:
    """Tokens of each conversation as the chat template renders it (the tokenizer must carry it)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; call data.chat.install_chat_template first")
    return token_lengths([render_text(c, tokenizer) for c in convs], tokenizer)


def over_limits(lengths: Sequence[int], limits: Mapping[str, int]) -> dict[str, int]:
    """Items longer than each limit."""
    v = np.asarray(lengths, dtype=np.int64)
    return {label: int((v > n).sum()) for label, n in limits.items()}


def mean_repetition(texts: Iterable[str], n: int) -> float:
    """Mean over texts of curation's repeated n-gram share (0 for no texts)."""
    fractions = [repeated_fraction(words(t), n) for t in texts]
    return round(float(np.mean(fractions)), 6) if fractions else 0.0


def profile_texts(name: str, path: str | Path, texts: Iterable[str], tokenizer: Any, limits: Mapping[str, int] = {},
                  cfg: CurateConfig = CurateConfig(), limit: int | None = None) -> TextSourceProfile:
    """A pretraining source's lengths, repetition and near-duplicate rate (the first `limit` documents;
    the caller sets `bad_lines` when its reader skipped some)."""
    docs: list[str] = []
    limited = False
    for text in texts:
        if limit is not None and len(docs) >= limit:
            limited = True  # one more document than the limit exists
            break
        docs.append(text)
    lengths = token_lengths(docs, tokenizer)
    dups = near_duplicates(docs, cfg.jaccard_threshold, cfg.num_perm, cfg.bands, cfg.shingle_size, cfg.minhash_seed)
    return TextSourceProfile(name=name, path=str(path), tokens=LengthStats.of(lengths),
                             repetition=mean_repetition(docs, cfg.repeat_ngram), limits=dict(limits),
                             over_limit=over_limits(lengths, limits), documents=len(docs), limited=limited,
                             near_duplicate_rate=round(len(dups) / len(docs), 6) if docs else 0.0)


def tool_call_names(message: dict) -> list[str]:
    """The tool names an assistant message calls (OpenAI `{"function": {"name"}}` or bare `{"name"}`)."""
    return [(call.get("function", call) or {}).get("name") or "?" for call in message.get("tool_calls") or []]


def _turns(convs: Sequence[dict]) -> tuple[list[int], list[int], list[str], Counter[str], int]:
    """Per conversation messages and assistant turns; every reasoning trace; calls per tool; conversations calling."""
    messages, assistant, traces, tools, calling = [], [], [], Counter(), 0
    for conv in convs:
        turns = [m for m in conv["messages"] if m.get("role") == "assistant"]
        messages.append(len(conv["messages"]))
        assistant.append(len(turns))
        traces += [m["reasoning_content"] for m in turns if m.get("reasoning_content")]
        names = [n for m in turns for n in tool_call_names(m)]
        tools.update(names)
        calling += bool(names)
    return messages, assistant, traces, tools, calling


def profile_conversations(name: str, path: str | Path, convs: Sequence[dict], tokenizer: Any,
                          curation: Mapping[str, Any] | None = None, domain: str | None = None,
                          limits: Mapping[str, int] = {}, cfg: CurateConfig = CurateConfig(),
                          curation_report: str | None = None) -> ConversationSourceProfile:
    """An SFT source's curated conversations: lengths, turns, reasoning, tools, repetition, curation counts."""
    lengths = conversation_lengths(convs, tokenizer)
    messages, assistant, traces, tools, calling = _turns(convs)
    labels = [domain or (c.get("domain") if isinstance(c.get("domain"), str) else None) or name for c in convs]
    by_domain: dict[str, list[int]] = {}
    for label, n in zip(labels, lengths):
        by_domain.setdefault(label, []).append(n)
    stats = CurationStats.of(curation, curation_report) if curation is not None else None
    out = ConversationSourceProfile(
        name=name, path=str(path), tokens=LengthStats.of(lengths), limits=dict(limits),
        over_limit=over_limits(lengths, limits), conversations=len(convs),
        domains=dict(sorted(Counter(labels).items())),
        repetition=mean_repetition((conversation_text(c, tools=False) for c in convs), cfg.repeat_ngram),
        messages=LengthStats.of(messages), assistant_turns=LengthStats.of(assistant),
        reasoning_tokens=LengthStats.of(token_lengths(traces, tokenizer)),
        reasoning_turn_share=round(len(traces) / sum(assistant), 6) if sum(assistant) else 0.0,
        tools=ToolStats.of(tools, calling), curation=stats)
    out._by_domain = by_domain
    return out


def pack_limits(substages: Iterable[Any], domain: str) -> dict[str, int]:
    """{sub-stage name: seq_length} of the SFT sub-stages whose blend weighs `domain` (its packs' size)."""
    return {s.name: s.seq_length for s in substages if s.blend.weights.get(domain, 0) > 0}


def profile_curated(root: Path, sources: Sequence[Any], tokenizer: Any, substages: Iterable[Any] = (),
                    cfg: CurateConfig = CurateConfig()) -> list[ConversationSourceProfile]:
    """Every SFT source of a curated directory (data/sft_assembly.curate_sources: `<name>.jsonl` kept,
    `<name>.report.json`, `summary.json`), each under its domain, at the pack sizes of the sub-stages
    that weigh that domain. `sources` are SFTDataSource-like (name, domain_name)."""
    root, substages = Path(root), list(substages)
    summary = json.loads((root / "summary.json").read_text())
    out = []
    for s in sources:
        kept = root / f"{s.name}.jsonl"
        limits = pack_limits(substages, s.domain_name)
        out.append(profile_conversations(s.name, kept, read_jsonl(kept), tokenizer, summary[s.name], s.domain_name,
                                         limits, cfg, str(root / f"{s.name}.report.json")))
    return out


# --------------------------------------------------------------------------- the report

def domain_profiles(sources: Sequence[ConversationSourceProfile]) -> list[DomainProfile]:
    """Conversations pooled by domain: counts, token sums, shares and the length distribution."""
    lengths: dict[str, list[int]] = {}
    members: dict[str, list[str]] = {}
    for s in sources:
        for d, values in s._by_domain.items():
            lengths.setdefault(d, []).extend(values)
            members.setdefault(d, []).append(s.name)
    convs = sum(len(v) for v in lengths.values()) or 1
    tokens = sum(sum(v) for v in lengths.values()) or 1
    return [DomainProfile(domain=d, sources=members[d], conversations=len(v),
                          conversation_share=round(len(v) / convs, 6), tokens=sum(v),
                          token_share=round(sum(v) / tokens, 6), lengths=LengthStats.of(v))
            for d, v in sorted(lengths.items())]


def build_profile(text_sources: Sequence[TextSourceProfile], sft_sources: Sequence[ConversationSourceProfile],
                  tokenizer: str, cfg: CurateConfig = CurateConfig()) -> DataProfile:
    """The report over every source: domains and tools pooled, then the warnings."""
    tools: Counter[str] = Counter()
    for s in sft_sources:
        tools.update(s.tools.per_tool)
    report = DataProfile(tokenizer=tokenizer, repetition_ngram=cfg.repeat_ngram, text_sources=list(text_sources),
                         sft_sources=list(sft_sources), domains=domain_profiles(sft_sources),
                         tools=ToolStats.of(tools, sum(s.tools.conversations for s in sft_sources)))
    report.warnings = profile_warnings(report)
    return report


# --------------------------------------------------------------------------- one file

def detect_kind(path: Path) -> Literal["text", "conversations"]:
    """Conversations when the first JSON object line has `messages`, else text rows; BadInput (file:line)
    when no line is a JSON object (the first bad line is named) or the file has no lines."""
    first_bad = None
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                first_bad = first_bad or f"{path}:{lineno}: not a JSON line ({str(e)[:80]})"
                continue
            if isinstance(row, dict):
                return "conversations" if "messages" in row else "text"
            first_bad = first_bad or f"{path}:{lineno}: a JSON {type(row).__name__}, not an object"
    raise BadInput(first_bad or f"{path}: no lines to profile")


def profile_file(path: Path, tokenizer: Any, tokenizer_name: str, limits: Mapping[str, int] = {},
                 cfg: CurateConfig = CurateConfig(), limit: int | None = None) -> DataProfile:
    """One JSONL file: text rows (a bad line stops with file:line, as a pretraining source does) or
    conversations (curated in memory, nothing written, never failed for its reject rate: the profile
    reports the rejects)."""
    if detect_kind(path) == "text":
        return build_profile([profile_texts(path.stem, path, read_texts(path, "text"), tokenizer, limits, cfg,
                                            limit=limit)], [], tokenizer_name, cfg)
    report = curate(path, cfg, max_reject_rate=1.0)
    conv = profile_conversations(path.stem, path, report.kept, tokenizer, report.to_dict(), None, limits, cfg)
    return build_profile([], [conv], tokenizer_name, cfg)


def profile_metrics(report: DataProfile) -> dict[str, float]:
    """The few numbers worth a chart: per source mean/p99 tokens, per domain shares, the top tool's share."""
    out: dict[str, float] = {"data/profile/warnings": len(report.warnings)}
    for s in report.sft_sources:
        out |= {f"data/profile/{s.name}/tokens_mean": s.tokens.mean, f"data/profile/{s.name}/tokens_p99": s.tokens.p99}
    for d in report.domains:
        out |= {f"data/profile/domain/{d.domain}/conversation_share": d.conversation_share,
                f"data/profile/domain/{d.domain}/token_share": d.token_share}
    if report.tools.top_share is not None:
        out["data/profile/tools/top_share"] = report.tools.top_share
    return out
