"""curate(): one pass over a JSONL source, every check in order, a report and a rejects file.

Order (cheap and certain first): parse -> structure -> length -> repetition -> exact dedup
-> near dedup. Dedup indexes only kept samples, so the first of a duplicate group survives.
Every rejected line goes to the rejects JSONL as {source, line, reason, detail, raw}, with
its 1-based line number and the raw text, so it can be inspected or fixed; blank lines are
skipped. A source whose reject rate exceeds `max_reject_rate` raises CurationError: a
dirty source should stop the stage rather than silently shrink the data.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagewise.data.curate.dedup import ExactDedup, NearDedup
from stagewise.data.curate.length import check_length
from stagewise.data.curate.repetition import check_repetition
from stagewise.data.curate.structural import Rejected, check_structure, parse_line
from stagewise.data.curate.text import conversation_text
from stagewise.data.sft_config import CurateConfig

CHECKS = ("structure", "length", "repetition", "exact_dedup", "near_dedup")


class CurationError(ValueError):
    """A source rejected more than its allowed fraction of lines."""

    def __init__(self, source: str, rate: float, limit: float, rejected: dict[str, int], rejects_path: Path | None):
        top = ", ".join(f"{r} {n}" for r, n in sorted(rejected.items(), key=lambda kv: -kv[1])[:4])
        where = f"; rejects in {rejects_path}" if rejects_path else ""
        super().__init__(f"source {source!r}: {rate:.1%} of lines rejected, above max_reject_rate "
                         f"{limit:.1%} ({top}){where}")
        self.source, self.rate, self.limit = source, rate, limit


@dataclass
class CurateReport:
    """What curation kept and why it rejected the rest."""

    source: str
    total: int
    """Non-blank lines read."""
    kept: list[dict]
    checked: dict[str, int]
    """Samples that reached each check family (CHECKS order)."""
    rejected: dict[str, int]
    """Rejected samples per reason."""
    rejects_path: Path | None = None
    near_dedup_bands: int | None = field(default=None)

    @property
    def reject_rate(self) -> float:
        return sum(self.rejected.values()) / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The summary (kept as a count), JSON-ready."""
        return {"source": self.source, "total": self.total, "kept": len(self.kept),
                "rejected": dict(sorted(self.rejected.items())), "checked": self.checked,
                "reject_rate": round(self.reject_rate, 6), "near_dedup_bands": self.near_dedup_bands,
                "rejects_path": str(self.rejects_path) if self.rejects_path else None}


def read_lines(path: str | Path) -> Iterator[bytes]:
    """Raw lines of a file (bytes: a bad encoding is a rejected line, not a crash)."""
    with open(path, "rb") as f:
        yield from f


class _Curator:
    """The checks with their dedup state, applied to one sample at a time."""

    def __init__(self, cfg: CurateConfig, tokenizer: Any | None) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self.exact = ExactDedup() if cfg.exact_dedup else None
        self.near = NearDedup(cfg.jaccard_threshold, cfg.num_perm, cfg.bands, cfg.shingle_size,
                              cfg.minhash_seed) if cfg.near_dedup else None
        self.checked: Counter[str] = Counter()

    def __call__(self, line: str | bytes, lineno: int) -> dict:
        self.checked["structure"] += 1
        conv = parse_line(line)
        check_structure(conv)
        self.checked["length"] += 1
        check_length(conv, self.cfg, self.tokenizer)
        self.checked["repetition"] += 1
        check_repetition(conv, self.cfg)
        text = conversation_text(conv, tools=False)
        digest = sig = None
        if self.exact is not None:
            self.checked["exact_dedup"] += 1
            digest = self.exact.check(text)
        if self.near is not None:
            self.checked["near_dedup"] += 1
            sig = self.near.check(text)
        if digest is not None:
            self.exact.add(lineno, digest)
        if sig is not None:
            self.near.add(lineno, sig)
        return conv


def _raw(line: str | bytes) -> str:
    return line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line


def curate(lines: Iterable[str | bytes] | str | Path, cfg: CurateConfig, rejects_path: str | Path | None = None,
           source: str | None = None, tokenizer: Any | None = None,
           max_reject_rate: float | None = None) -> CurateReport:
    """Run every check over `lines` (or the file at that path); see the module docstring.

    `source` names the input in reports and errors (default: the file stem, or "input").
    `max_reject_rate` overrides cfg.max_reject_rate. Raises CurationError when exceeded
    (the rejects file is complete by then)."""
    if isinstance(lines, (str, Path)):
        source = source or Path(lines).stem
        lines = read_lines(lines)
    source = source or "input"
    curator = _Curator(cfg, tokenizer)
    kept: list[dict] = []
    rejected: Counter[str] = Counter()
    total = 0
    out = None
    if rejects_path is not None:
        Path(rejects_path).parent.mkdir(parents=True, exist_ok=True)
        out = open(rejects_path, "w", encoding="utf-8")
    try:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            total += 1
            try:
                kept.append(curator(line, lineno))
            except Rejected as r:
                rejected[r.reason] += 1
                if out is not None:
                    row = {"source": source, "line": lineno, "reason": r.reason, "detail": r.detail,
                           "raw": _raw(line).rstrip("\r\n")}
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
    finally:
        if out is not None:
            out.close()
    report = CurateReport(source, total, kept, {c: curator.checked[c] for c in CHECKS}, dict(rejected),
                          Path(rejects_path) if rejects_path else None,
                          curator.near.bands if curator.near else None)
    limit = cfg.max_reject_rate if max_reject_rate is None else max_reject_rate
    if report.reject_rate > limit:
        raise CurationError(source, report.reject_rate, limit, report.rejected, report.rejects_path)
    return report
