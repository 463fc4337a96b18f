"""`json_answer`: the completion is the JSON object {"answer": <value>} with the expected value.

The format instruction the demo world trains ("Reply only with JSON of the form
{"answer": <number>}"): the whole answer must parse as a JSON object whose only key is
"answer"; the value matches expected_answer as exact_answer does (12 == 12.0 == "12").
"""

from __future__ import annotations

import json
from typing import Any

from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments._text import answer_text, same_answer

_MISSING = object()


def _answer(completion: str) -> Any:
    """The "answer" value of a completion that is exactly {"answer": ...}; _MISSING otherwise."""
    try:
        obj = json.loads(answer_text(completion))
    except (json.JSONDecodeError, RecursionError):
        return _MISSING
    if not isinstance(obj, dict) or set(obj) != {"answer"}:
        return _MISSING
    return obj["answer"]


def verify(completion: str, row: RLRow) -> float | None:
    """1.0 for {"answer": <expected>}, 0.0 for anything else, None when the row has no answer."""
    if row.expected_answer is None or isinstance(row.expected_answer, (dict, list)):
        return None
    got = _answer(completion)
    if got is _MISSING or isinstance(got, (dict, list, bool)) or got is None:
        return 0.0
    return 1.0 if same_answer(got, row.expected_answer) else 0.0


def well_formed(completion: str, row: RLRow) -> bool:
    """The answer parses as a JSON object with the single key "answer"."""
    return _answer(completion) is not _MISSING
