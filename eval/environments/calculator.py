"""`calculator`: the completion calls the calculator tool with an expression worth expected_answer.

The call is what data/templates/chat.jinja renders for an assistant tool call,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "(12 + 7) * 3"}}
    </tool_call>

(`arguments` may also be a JSON string holding that object, as OpenAI messages carry it). The
first calculator call counts; its expression is evaluated by the demo world's own safe
evaluator (data/world/calculator.py, never eval()) and compared by value to expected_answer.
Expressions over MAX_CHARS characters or with more than MAX_POWERS `**` are wrong unevaluated:
a sampled completion could otherwise nest powers into a number with millions of digits.
"""

from __future__ import annotations

import json
import re
from typing import Any

from stagewise.data.rl_rows import RLRow
from stagewise.data.world.calculator import evaluate
from stagewise.eval.environments._text import answer_text, as_number

MAX_CHARS = 200
MAX_POWERS = 2
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def calls(completion: str) -> list[dict[str, Any]]:
    """The parsable tool calls of a completion as {"name", "arguments": dict}, in order."""
    out = []
    for body in _CALL.findall(answer_text(completion)):
        try:
            call = json.loads(body)
            if not isinstance(call, dict):
                continue
            args = call.get("arguments")
            if isinstance(args, str):
                args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(call.get("name"), str) and isinstance(args, dict):
            out.append({"name": call["name"], "arguments": args})
    return out


def expression(completion: str) -> str | None:
    """The expression of the first calculator call, or None when there is none."""
    for call in calls(completion):
        expr = call["arguments"].get("expression")
        if call["name"] == "calculator" and isinstance(expr, str):
            return expr
    return None


def verify(completion: str, row: RLRow) -> float | None:
    """1.0 when the first calculator call's expression evaluates to expected_answer, else 0.0
    (no call, bad expression, wrong value); None when expected_answer is not a number."""
    expected = as_number(row.expected_answer)
    if expected is None:
        return None
    expr = expression(completion)
    if expr is None or len(expr) > MAX_CHARS or expr.count("**") > MAX_POWERS:
        return 0.0
    got = as_number(evaluate(expr))  # "error: ..." is not a number
    return 1.0 if got is not None and got == expected else 0.0


def well_formed(completion: str, row: RLRow) -> bool:
    """Exactly one tool call block, and it is a parsable calculator call with a string expression."""
    return len(_CALL.findall(answer_text(completion))) == 1 and expression(completion) is not None
