"""Warnings for skew in a data profile, each with the number behind it and the threshold it crossed.

A warning is not an error: the data may be skewed on purpose (the demo world has one tool).
It says what a person should look at before training, and why it matters. The thresholds
are named below, each with the reason for its value; `profile_warnings` applies them to a
finished `data.profile.DataProfile`, so warnings can be recomputed from a saved report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from stagewise.data.profile import DataProfile

TOOL_SHARE_MAX = 0.5
"""One tool making more than half of all tool calls: the model mostly learns to call that one
tool, and learns little about choosing between tools (or when to call none)."""
DOMAIN_SHARE_MAX = 0.5
"""One domain holding more than half of the conversations or of the tokens: a blend can only
rebalance it by repeating the other domains (up to max_epochs) or leaving data unused. Judged
only when there are at least two domains (a one-domain file is a choice, not a skew)."""
REPETITION_MAX = 0.15
"""Mean share of repeated word 4-grams per document above 15%: loops, boilerplate or templated
text. Of the order of Gopher's repetition filter (Rae et al. 2021, appendix A: a document is dropped
when duplicated 5-grams cover more than 15% of its characters); the demo world's real text (Python
sources) averages 0.12, its deliberately noisy source 0.17."""
NEAR_DUPLICATE_MAX = 0.05
"""More than 5% of a source's documents near-duplicate an earlier one (MinHash Jaccard at or above
curation's threshold): those examples are in effect trained on several times, and the source is
less diverse than its size says. For SFT sources curation removes them; the warning says the
source was this repetitive."""
REJECT_RATE_MAX = 0.10
"""Curation rejecting more than 10% of a source's lines: the source is dirty, and what it keeps may
be biased toward what passes the checks (the hard stop is the recipe's max_reject_rate)."""


class ProfileWarning(BaseModel):
    """One skew: a short code, what it is about, the measured value and the threshold it crossed."""

    code: str
    subject: str
    value: float
    threshold: float
    message: str


def profile_warnings(report: "DataProfile") -> list[ProfileWarning]:
    """Every warning the thresholds above raise on `report`, tools and domains first."""
    return [*_tool_warnings(report), *_domain_warnings(report), *_length_warnings(report),
            *_content_warnings(report)]


def _tool_warnings(report: "DataProfile") -> list[ProfileWarning]:
    t = report.tools
    if t.top_share is None or t.top_share <= TOOL_SHARE_MAX:
        return []
    return [ProfileWarning(code="tool_share", subject=t.top_tool or "", value=t.top_share, threshold=TOOL_SHARE_MAX,
                           message=f"tool {t.top_tool!r} makes {t.top_share:.0%} of {t.calls:,} tool calls "
                                   f"({len(t.per_tool)} tool(s) in all): little is learned about choosing a tool")]


def _domain_warnings(report: "DataProfile") -> list[ProfileWarning]:
    if len(report.domains) < 2:
        return []
    out = []
    for d in report.domains:
        for what, share, count in (("conversations", d.conversation_share, d.conversations),
                                   ("tokens", d.token_share, d.tokens)):
            if share > DOMAIN_SHARE_MAX:
                out.append(ProfileWarning(
                    code=f"domain_{what}_share", subject=d.domain, value=share, threshold=DOMAIN_SHARE_MAX,
                    message=f"domain {d.domain!r} holds {share:.0%} of the SFT {what} ({count:,})"))
    return out


def _length_warnings(report: "DataProfile") -> list[ProfileWarning]:
    """p99 length above a sequence/pack length the source trains at."""
    out = []
    for s in [*report.text_sources, *report.sft_sources]:
        items = s.tokens.count
        for label, limit in s.limits.items():
            if s.tokens.p99 <= limit:
                continue
            n = s.over_limit.get(label, 0)
            fate = ("cut across sequences" if s.kind == "text"
                    else "dropped from its packs (never cut)")
            out.append(ProfileWarning(
                code="length_over_limit", subject=f"{s.name}@{label}", value=s.tokens.p99, threshold=limit,
                message=f"{s.name}: p99 length {s.tokens.p99:,} tokens > {label}'s {limit:,}: {n:,} of {items:,} "
                        f"({n / max(items, 1):.1%}) are {fate} there"))
    return out


def _content_warnings(report: "DataProfile") -> list[ProfileWarning]:
    """High repetition, near duplicates and reject rates, per source."""
    out = []
    for s in [*report.text_sources, *report.sft_sources]:
        if s.repetition > REPETITION_MAX:
            out.append(ProfileWarning(code="repetition", subject=s.name, value=s.repetition, threshold=REPETITION_MAX,
                                      message=f"{s.name}: on average {s.repetition:.0%} of a document's word "
                                              f"{report.repetition_ngram}-grams repeat an earlier one"))
        dups = s.near_duplicate_rate if s.kind == "text" else s.curation.duplicate_rate if s.curation else None
        if dups is not None and dups > NEAR_DUPLICATE_MAX:
            what = "documents" if s.kind == "text" else "lines"
            fate = "" if s.kind == "text" else " (removed by curation)"
            out.append(ProfileWarning(code="near_duplicates", subject=s.name, value=dups, threshold=NEAR_DUPLICATE_MAX,
                                      message=f"{s.name}: {dups:.1%} of its {what} duplicate an earlier one{fate}"))
        if s.kind == "conversations" and s.curation and s.curation.reject_rate > REJECT_RATE_MAX:
            c = s.curation
            top = ", ".join(f"{r} {n}" for r, n in sorted(c.rejected.items(), key=lambda kv: -kv[1])[:3])
            out.append(ProfileWarning(code="reject_rate", subject=s.name, value=c.reject_rate, threshold=REJECT_RATE_MAX,
                                      message=f"{s.name}: curation rejected {c.reject_rate:.1%} of {c.total:,} "
                                              f"lines ({top})"))
    return out
