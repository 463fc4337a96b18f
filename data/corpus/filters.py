"""Heuristic document filters: plain functions of (text, config) returning a reject reason or None.

Cheap and certain first; the first failing check names the reason a document is counted under
(the manifest's `rejected` per source). The thresholds are FilterConfig's.
"""

from __future__ import annotations

from collections.abc import Callable

from stagewise.data.corpus.config import FilterConfig
from stagewise.data.curate.text import WORD


def too_long(text: str, cfg: FilterConfig) -> bool:
    return cfg.max_chars is not None and len(text) > cfg.max_chars


def too_short(text: str, cfg: FilterConfig) -> bool:
    if cfg.min_words == 0:
        return False
    found = 0
    for _ in WORD.finditer(text):
        found += 1
        if found >= cfg.min_words:
            return False
    return True


def symbol_heavy(text: str, cfg: FilterConfig) -> bool:
    """More than max_symbol_fraction of the non-space characters are neither letters nor digits."""
    visible = [c for c in text if not c.isspace()]
    if not visible:
        return False
    symbols = sum(1 for c in visible if not c.isalnum())
    return symbols / len(visible) > cfg.max_symbol_fraction


def repeated_lines(text: str, cfg: FilterConfig) -> bool:
    """More than max_duplicate_line_fraction of a multi-line document's non-blank lines repeat an earlier one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return False
    return (len(lines) - len(set(lines))) / len(lines) > cfg.max_duplicate_line_fraction


FILTERS: tuple[tuple[str, Callable[[str, FilterConfig], bool]], ...] = (
    ("too_long", too_long), ("too_short", too_short), ("symbol_heavy", symbol_heavy),
    ("repeated_lines", repeated_lines))
"""(reason, check) in the order they run."""


def reject_reason(text: str, cfg: FilterConfig) -> str | None:
    """The reason the first failing filter gives, or None when the document is kept."""
    for reason, check in FILTERS:
        if check(text, cfg):
            return reason
    return None
