"""Held-out rows in two splits: `dev`, which tuning, gates and ablations may read, and `test`,
which only the closing table and the README report.

    parts = split_rows(rows, prompt_key, seed)     # {"dev": [...], "test": [...]}
    split_of(prompt_key(row), seed)                 # "dev" or "test"

A held-out file (the demo world's `sft_eval.jsonl` and `rl_eval.jsonl`, or a team's own `heldout`)
is split by a seeded hash of each row's prompt, half and half: a prompt is on one side only, the
same prompt is on the same side in every stage (an SFT conversation and the RL row asking the same
thing hash alike: data.chat.prompt_key and data.rl_rows.prompt_key agree), and nothing about the
split depends on the order or number of rows. The stages log `<stage>/dev/...` and
`<stage>/test/...` (e.g. `rl/test/pass_at_1/all`, `eval/sft_dev/exact_match`); a gate may read
only dev (recipe/checks.py refuses a gate on a test metric).
"""

from __future__ import annotations

from typing import Callable, Literal, TypeVar

from stagewise.data.chat import unit_hash

Split = Literal["dev", "test"]
SPLITS: tuple[Split, Split] = ("dev", "test")
DEV_FRACTION = 0.5
"""The share of held-out prompts in dev."""
T = TypeVar("T")


def split_of(key: str, seed: int) -> Split:
    """The split a prompt (its key) belongs to under the recipe's seed."""
    return "dev" if unit_hash(seed, "heldout-split:" + key) < DEV_FRACTION else "test"


def split_rows(rows: list[T], key_of: Callable[[T], str], seed: int) -> dict[Split, list[T]]:
    """`rows` (in their order) by split: {"dev": [...], "test": [...]}."""
    out: dict[Split, list[T]] = {"dev": [], "test": []}
    for row in rows:
        out[split_of(key_of(row), seed)].append(row)
    return out


def is_test_metric(name: str) -> bool:
    """Whether a metric name is a test split's (`<stage>/test/...`, `eval/sft_test/...`)."""
    parts = name.split("/")
    return "test" in parts or any(p.endswith("_test") for p in parts)
