"""`sorting`: the completion is a comma-separated list equal, item by item, to the expected list.

expected_answer is the sorted list (a JSON list, or the same comma-separated text); items
compare as exact_answer does (numbers by value, text normalised), order and count matter.
"""

from __future__ import annotations

from typing import Any

from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments._text import answer_text, same_answer


def _items(value: Any) -> list[Any] | None:
    """A list from a JSON list or from comma-separated text; None when an item is empty."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str) or not value.strip():
        return None
    items = [item.strip() for item in value.split(",")]
    return None if any(not item for item in items) else items


def verify(completion: str, row: RLRow) -> float | None:
    """1.0 for the expected list, 0.0 for any other (or unparsable) answer; None without one."""
    expected = _items(row.expected_answer)
    if expected is None:
        return None
    got = _items(answer_text(completion))
    if got is None or len(got) != len(expected):
        return 0.0
    return 1.0 if all(same_answer(g, e) for g, e in zip(got, expected)) else 0.0


def well_formed(completion: str, row: RLRow) -> bool:
    """One line of non-empty comma-separated items."""
    text = answer_text(completion)
    return "\n" not in text and _items(text) is not None
