"""Arithmetic problems with worked steps: column addition and subtraction, long multiplication.

`make_problem` returns a structured `Problem` (question, steps, answer) so that SFT and RL
stages can reuse the generator for verifiable problems; `render_problem` is the
pretraining text, the working written out the way a person does it on paper.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from stagewise.data.world._common import rng_for

PLACES = ["ones", "tens", "hundreds", "thousands", "ten thousands", "hundred thousands",
          "millions", "ten millions", "hundred millions"]


@dataclass(frozen=True)
class Problem:
    """A problem, its worked steps and the integer answer."""

    question: str
    steps: tuple[str, ...]
    answer: int
    op: str


def _digits(n: int, width: int) -> list[int]:
    """Digits of n, least significant first, padded to width."""
    return [(n // 10**i) % 10 for i in range(width)]


def add_steps(a: int, b: int) -> list[str]:
    """Column addition, ones first, with carries."""
    width = len(str(max(a, b)))
    steps, carry = [], 0
    for i, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width))):
        total = x + y + carry
        steps.append(f"{PLACES[i].capitalize()}: {x} + {y} + {carry} = {total}, write {total % 10}, carry {total // 10}.")
        carry = total // 10
    if carry:
        steps.append(f"Bring down the final carry {carry}.")
    return steps


def sub_steps(a: int, b: int) -> list[str]:
    """Column subtraction of b from a (a >= b), ones first, with borrows."""
    width = len(str(a))
    steps, borrow = [], 0
    for i, (x, y) in enumerate(zip(_digits(a, width), _digits(b, width))):
        top = x - borrow
        if top < y:
            steps.append(f"{PLACES[i].capitalize()}: {top} < {y}, borrow 1: {top + 10} - {y} = {top + 10 - y}.")
            borrow = 1
        else:
            steps.append(f"{PLACES[i].capitalize()}: {top} - {y} = {top - y}.")
            borrow = 0
    return steps


def mul_steps(a: int, b: int) -> list[str]:
    """Long multiplication: one partial product per digit of b, then their sum."""
    partials = []
    steps = []
    for i, d in enumerate(_digits(b, len(str(b)))):
        part = a * d * 10**i
        partials.append(part)
        steps.append(f"{a} x {d * 10**i} = {part}.")
    if len(partials) > 1:
        steps.append(f"Add the partial products: {' + '.join(map(str, partials))} = {sum(partials)}.")
    return steps


def make_problem(rng: random.Random) -> Problem:
    """A random multi-digit +, - or x problem with its worked steps."""
    op = rng.choice(["+", "-", "x"])
    if op == "x":
        a, b = rng.randint(10, 9_999), rng.randint(2, 999)
        return Problem(f"{a} x {b}", tuple(mul_steps(a, b)), a * b, op)
    a, b = rng.randint(10, 999_999), rng.randint(10, 999_999)
    if op == "+":
        return Problem(f"{a} + {b}", tuple(add_steps(a, b)), a + b, op)
    if a >= b:
        return Problem(f"{a} - {b}", tuple(sub_steps(a, b)), a - b, op)
    steps = (f"{a} < {b}, so compute {b} - {a} and negate.", *sub_steps(b, a))
    return Problem(f"{a} - {b}", steps, a - b, op)


def make_small_problem(rng: random.Random, digits: int) -> Problem:
    """A +, - or x problem with 1- or 2-digit operands (x by a single digit), no worked steps:
    the sizes a small model can answer directly, next to `make_problem`'s multi-digit ones."""
    op = rng.choice(["+", "-", "x"])
    lo, hi = (0, 9) if digits == 1 else (10, 99)
    a = rng.randint(lo, hi)
    b = rng.randint(2, 9) if op == "x" else rng.randint(lo, hi)
    answer = {"+": a + b, "-": a - b, "x": a * b}[op]
    return Problem(f"{a} {op} {b}", (), answer, op)


def render_problem(p: Problem) -> str:
    """The pretraining text: the question, the working, the answer."""
    return "\n".join([f"Compute {p.question}.", *p.steps, f"Answer: {p.answer}"])


def arithmetic_texts(n: int, seed: int) -> list[str]:
    """`n` rendered problems, deterministic from the seed."""
    rng = rng_for(seed, "arithmetic")
    return [render_problem(make_problem(rng)) for _ in range(n)]
