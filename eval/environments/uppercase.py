"""`uppercase`: the completion is the expected words written in uppercase letters.

expected_answer holds the words (any case); the answer must equal them upper-cased, with runs
of whitespace counting as one space. Case is the point of the task, so it is not folded:
"amber fox" is wrong where "AMBER FOX" is asked.
"""

from __future__ import annotations

from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments._text import answer_text


def _words(text: str) -> str:
    return " ".join(text.split())


def verify(completion: str, row: RLRow) -> float | None:
    """1.0 when the answer is the expected words in uppercase, else 0.0; None without an answer."""
    if not isinstance(row.expected_answer, str) or not row.expected_answer.strip():
        return None
    return 1.0 if _words(answer_text(completion)) == _words(row.expected_answer).upper() else 0.0


def well_formed(completion: str, row: RLRow) -> bool:
    """Non-empty, has letters, and none of them lowercase."""
    text = answer_text(completion)
    return any(c.isalpha() for c in text) and text == text.upper()
