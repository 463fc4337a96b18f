"""Text normalisation shared by the verifiers: where the answer is, and when two answers are equal.

A completion may still carry a reasoning block or the end-of-turn marker (`<think>...</think>`
and `<|im_end|>` from data/templates/chat.jinja); the answer is what follows the last
`</think>`. Numbers compare by value ("12" == "12.0" == " +12 ", "1,200" == "1200"), text by
its case-folded, whitespace-collapsed form without a final full stop.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

END_OF_TURN = "<|im_end|>"
THINK_END = "</think>"
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d*)?$")


def answer_text(completion: str) -> str:
    """The answer part of a completion: after the last `</think>`, without `<|im_end|>`, stripped."""
    text = completion.rsplit(THINK_END, 1)[-1]
    text = text.strip()
    if text.endswith(END_OF_TURN):
        text = text[: -len(END_OF_TURN)]
    return text.strip()


def as_number(value: Any) -> Decimal | None:
    """A finite number from an int/float or from text like " 12 ", "12.0", "+12", "-3.50", "1,200";
    None for anything else (bools, words, NaN, infinities)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, str):
        text = value.strip()
        if _THOUSANDS.match(text):
            text = text.replace(",", "")
    else:
        return None
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        return None
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def norm_text(value: Any) -> str:
    """Case-folded text with runs of whitespace as one space, no trailing full stop."""
    text = " ".join(str(value).split()).casefold()
    return text[:-1].rstrip() if text.endswith(".") and len(text) > 1 else text


def same_answer(got: Any, expected: Any) -> bool:
    """Equal as numbers when both are numbers, else equal as normalised text."""
    a, b = as_number(got), as_number(expected)
    if a is not None and b is not None:
        return a == b
    if a is not None or b is not None:
        return False
    return norm_text(got) == norm_text(expected)
