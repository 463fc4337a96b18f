"""Repetition filters: degenerate assistant turns that loop on a phrase.

Two views, each on the words of one assistant turn (reasoning + content + tool calls):

- local: some n-gram occurs more than `repeat_max_count` times inside a sliding window
  of `repeat_window` words (catches a loop even in a long, otherwise healthy trace);
- global: the fraction of the turn's n-grams that repeat an earlier one
  (1 - distinct / total) exceeds `repeat_max_fraction`, judged only on turns of at least
  `repeat_min_words` words (a short answer like "4 4 4" is not a degenerate trace).
"""

from __future__ import annotations

from collections import defaultdict

from stagewise.data.curate.structural import Rejected
from stagewise.data.curate.text import assistant_text, words
from stagewise.data.sft_config import CurateConfig


def ngram_positions(tokens: list[str], n: int) -> dict[tuple[str, ...], list[int]]:
    """Start positions of every n-gram."""
    pos: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for i in range(len(tokens) - n + 1):
        pos[tuple(tokens[i:i + n])].append(i)
    return pos


def max_in_window(positions: list[int], span: int) -> int:
    """Most positions inside any interval [p, p + span] (two pointers over sorted positions)."""
    best, lo = 0, 0
    for hi, p in enumerate(positions):
        while p - positions[lo] > span:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def window_repeats(tokens: list[str], n: int, window: int) -> tuple[int, tuple[str, ...] | None]:
    """(count, n-gram): the largest number of occurrences of one n-gram fully inside a window."""
    best, which = 0, None
    span = max(window - n, 0)  # start positions whose n-grams fit in one window
    for gram, positions in ngram_positions(tokens, n).items():
        if len(positions) > best:
            count = max_in_window(positions, span)
            if count > best:
                best, which = count, gram
    return best, which


def repeated_fraction(tokens: list[str], n: int) -> float:
    """Share of n-grams that repeat an earlier one (0 when there are none)."""
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    distinct = len({tuple(tokens[i:i + n]) for i in range(total)})
    return 1.0 - distinct / total


def check_repetition(conv: dict, cfg: CurateConfig) -> None:
    """Raise Rejected (repetition_window / repetition_fraction) for the first looping assistant turn."""
    n = cfg.repeat_ngram
    for i, m in enumerate(conv["messages"]):
        if m["role"] != "assistant":
            continue
        toks = words(assistant_text(m))
        count, gram = window_repeats(toks, n, cfg.repeat_window)
        if count > cfg.repeat_max_count:
            raise Rejected("repetition_window", f"turn {i}: {' '.join(gram or ())!r} {count} times within "
                                                f"{cfg.repeat_window} words (max {cfg.repeat_max_count})")
        if len(toks) >= cfg.repeat_min_words:
            frac = repeated_fraction(toks, n)
            if frac > cfg.repeat_max_fraction:
                raise Rejected("repetition_fraction", f"turn {i}: {frac:.2f} of its {n}-grams are repeats "
                                                      f"(max {cfg.repeat_max_fraction})")
