"""The demo world's calculator tool: its OpenAI definition and a safe evaluator.

The evaluator walks the expression's AST and allows numbers, + - * / // % ** (small
exponents only), unary minus and parentheses: a tool result is computed, never eval()'d.
SFT conversations call it with real arguments and show its real output; RL can reuse it.
"""

from __future__ import annotations

import ast
import operator
import random

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+, -, *, /, //, %, **, parentheses) and return the result.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression, e.g. (12 + 7) * 3"}},
            "required": ["expression"],
        },
    },
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 12:
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported expression element: {type(node).__name__}")


def evaluate(expression: str) -> str:
    """The result as text (integers stay integers, floats round to 6 places), or `error: ...`."""
    try:
        value = _eval(ast.parse(expression, mode="eval"))
    except ZeroDivisionError:
        return "error: division by zero"
    except (SyntaxError, ValueError, TypeError, OverflowError) as e:
        return f"error: {e}"
    if isinstance(value, float):
        value = round(value, 6)
        if value.is_integer():
            value = int(value)
    return str(value)


def random_expression(rng: random.Random) -> str:
    """Two or three integer operands with + - * and sometimes parentheses."""
    nums = [rng.randint(2, 999) for _ in range(rng.choice([2, 2, 3]))]
    ops = [rng.choice(["+", "-", "*"]) for _ in nums[1:]]
    if len(nums) == 3 and rng.random() < 0.5:
        return f"({nums[0]} {ops[0]} {nums[1]}) {ops[1]} {nums[2]}"
    expr = str(nums[0])
    for op, n in zip(ops, nums[1:]):
        expr += f" {op} {n}"
    return expr
