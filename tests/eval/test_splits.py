"""eval/splits.py: held-out rows split into dev and test by prompt, whatever the file's order or size."""

from __future__ import annotations

import random

from stagewise.data.chat import prompt_key
from stagewise.eval.splits import SPLITS, is_test_metric, split_of, split_rows


def _conv(i: int, repeat: int = 0) -> dict:
    return {"id": f"c{i}-{repeat}", "messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                                                  {"role": "assistant", "content": str(2 * i + repeat)}]}


def test_every_row_lands_in_one_split_and_a_prompt_never_straddles():
    rows = [_conv(i, r) for i in range(400) for r in range(2)]  # each prompt twice, answered differently
    parts = split_rows(rows, prompt_key, seed=3)
    assert set(parts) == set(SPLITS) and sum(map(len, parts.values())) == len(rows)
    dev_keys = {prompt_key(c) for c in parts["dev"]}
    assert not dev_keys & {prompt_key(c) for c in parts["test"]}
    assert 0.4 < len(parts["dev"]) / len(rows) < 0.6  # half and half, by hash


def test_the_split_depends_on_the_prompt_and_seed_only():
    rows = [_conv(i) for i in range(200)]
    shuffled = random.Random(0).sample(rows, len(rows))
    by_id = lambda part: sorted(c["id"] for c in part)  # noqa: E731
    assert {s: by_id(v) for s, v in split_rows(rows, prompt_key, 3).items()} == \
           {s: by_id(v) for s, v in split_rows(shuffled, prompt_key, 3).items()}
    assert by_id(split_rows(rows[:50], prompt_key, 3)["test"]) == sorted(c["id"] for c in rows[:50]
                                                                         if split_of(prompt_key(c), 3) == "test")
    other = split_rows(rows, prompt_key, 4)
    assert by_id(other["dev"]) != by_id(split_rows(rows, prompt_key, 3)["dev"])  # another seed, another split


def test_an_sft_conversation_and_the_rl_row_asking_the_same_are_on_the_same_side():
    from stagewise.data.rl_rows import prompt_key as row_key
    from stagewise.data.world.conversations import domain_conversations
    from stagewise.data.world.rl_prompts import _row

    convs = domain_conversations("arithmetic", 60, seed=5)
    for i, conv in enumerate(convs):
        row = _row(conv, "arithmetic", i)
        assert split_of(row_key(row), 5) == split_of(prompt_key(conv), 5)


def test_test_metrics_are_told_apart():
    for name in ("rl/test/pass_at_1/all", "eval/sft_test/exact_match", "distill/test/teacher/pass_at_1/x",
                 "quant/test/exact_match", "base/rl/test/pass_at_1/all"):
        assert is_test_metric(name), name
    for name in ("rl/dev/pass_at_1/all", "eval/sft_dev/exact_match", "eval/validation/loss", "eval/testing/acc"):
        assert not is_test_metric(name), name
