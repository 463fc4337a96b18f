"""`exact_answer`: the whole answer equals expected_answer (numbers by value, text normalised).

For short answers the prompt fixes (a number, a word): "12", "12.0" and " 12 " are the same
answer, and so are "Paris" and "paris."; anything around the answer ("The answer is 12") is
wrong, because the demo tasks ask for the answer alone.
"""

from __future__ import annotations

from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments._text import answer_text, as_number, same_answer


def verify(completion: str, row: RLRow) -> float | None:
    """1.0 when the answer equals expected_answer, 0.0 when not, None when the row has none."""
    if row.expected_answer is None or isinstance(row.expected_answer, (dict, list)):
        return None
    return 1.0 if same_answer(answer_text(completion), row.expected_answer) else 0.0


def well_formed(completion: str, row: RLRow) -> bool:
    """One non-empty line; a number when the expected answer is one."""
    text = answer_text(completion)
    if not text or "\n" in text:
        return False
    return as_number(row.expected_answer) is None or as_number(text) is not None
