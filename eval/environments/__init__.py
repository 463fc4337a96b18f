"""RL environments: the verifiers that turn a sampled completion into a reward.

An environment judges one completion (the assistant's text, reasoning and `<|im_end|>`
tolerated) against its RLRow (data/rl_rows.py): `verify` gives accuracy (1.0 right, 0.0
wrong, None when the row cannot be judged), `well_formed` the format reward (the answer
is in the required place and shape, right or wrong). A row names its environment in its
`environment` key; eval/rewards.py weighs the two with a length term.

    env = get_environment(row.environment)
    env.verify(completion, row), env.well_formed(completion, row)

Everything is plain Python on strings: no model, no tokenizer, cheap enough to score every
rollout of a step on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from stagewise.data.errors import BadInput
from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments import calculator, exact_answer, json_answer, sorting, uppercase

Verifier = Callable[[str, RLRow], float | None]
"""Completion text, row -> 1.0 (right) / 0.0 (wrong) / None (the row cannot be judged)."""


@dataclass(frozen=True)
class Environment:
    """A named verifier: accuracy, format, and one line saying what it checks."""

    name: str
    verify: Verifier
    well_formed: Callable[[str, RLRow], bool]
    about: str


def _env(name: str, module, about: str) -> Environment:
    return Environment(name, module.verify, module.well_formed, about)


ENVIRONMENTS: dict[str, Environment] = {e.name: e for e in [
    _env("exact_answer", exact_answer, "the answer alone equals expected_answer (numbers by value; case, spaces ignored)"),
    _env("json_answer", json_answer, 'the answer is the JSON object {"answer": <expected_answer>}'),
    _env("uppercase", uppercase, "the answer is expected_answer's words in uppercase letters"),
    _env("calculator", calculator, "a calculator tool call whose expression evaluates to expected_answer"),
    _env("sorting", sorting, "a comma-separated list equal, in order, to the expected list"),
]}


def get_environment(name: str) -> Environment:
    """The environment called `name`; BadInput listing the known ones when there is none."""
    try:
        return ENVIRONMENTS[name]
    except (KeyError, TypeError):
        raise BadInput(f"environment: unknown {name!r}; known: {', '.join(sorted(ENVIRONMENTS))}") from None


__all__ = ["ENVIRONMENTS", "Environment", "Verifier", "get_environment"]
