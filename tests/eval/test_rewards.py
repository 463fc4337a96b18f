"""Group rewards: hand-computed totals, and a length term with zero group mean that prefers
shorter right answers and never lifts a wrong one above a right one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments import get_environment
from stagewise.eval.rewards import RewardConfig, group_rewards, length_term


def row(expected) -> RLRow:
    return RLRow.model_validate({"responses_create_params": {"input": "Compute 3 x 4."}, "expected_answer": expected})


def test_hand_computed_group():
    # right, right, right, wrong; lengths 10, 20, 30, 5 -> mean of right 20, spread 20
    out = group_rewards(["12", "12.0", " 12 ", "13 apples"], [10, 20, 30, 5], row(12),
                        get_environment("exact_answer"), RewardConfig(accuracy=1.0, format=0.5, length=0.2))
    assert out["accuracy"] == [1.0, 1.0, 1.0, 0.0]
    assert out["format"] == [1.0, 1.0, 1.0, 0.0]
    assert out["length"] == [0.5, 0.0, -0.5, 0.0]
    assert out["total"] == pytest.approx([1.6, 1.5, 1.4, 0.0])
    assert out["unjudged"] == [0.0] * 4


def test_defaults_are_accuracy_only():
    out = group_rewards(["13", "12"], [1, 9], row(12), get_environment("exact_answer"), RewardConfig())
    assert out["total"] == [0.0, 1.0] and out["length"] == [0.0, 0.0]  # one right answer: no length term


def test_length_term_cases():
    assert length_term([True, True], [7, 7]) == [0.0, 0.0]  # equal lengths
    assert length_term([False, False, False], [1, 2, 3]) == [0.0, 0.0, 0.0]
    assert length_term([True, False, True], [4, 100, 8]) == [0.5, 0.0, -0.5]
    assert length_term([True, True, True, True], [10, 10, 10, 50]) == [0.25, 0.25, 0.25, -0.75]


def test_unjudged_counts_as_zero_and_is_flagged():
    out = group_rewards(["12", ""], [3, 4], row(None), get_environment("exact_answer"),
                        RewardConfig(format=1.0))
    assert out["accuracy"] == [0.0, 0.0] and out["unjudged"] == [1.0, 1.0]
    assert out["total"] == [1.0, 0.0]  # format still scores


def test_bad_config_and_mismatched_lengths():
    with pytest.raises(ValidationError):
        RewardConfig(lenght=0.1)
    with pytest.raises(ValidationError):
        RewardConfig(format=-1)
    with pytest.raises(ValueError, match="2 completions but 1 lengths"):
        group_rewards(["1", "2"], [3], row(1), get_environment("exact_answer"), RewardConfig())


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4096)), min_size=1, max_size=16),
       st.floats(0.0, 0.99))
def test_length_term_has_zero_mean_and_keeps_right_above_wrong(group, weight):
    correct, lengths = [c for c, _ in group], [n for _, n in group]
    term = length_term(correct, lengths)
    assert sum(term) == pytest.approx(0.0, abs=1e-9)
    assert all(t == 0.0 for t, c in zip(term, correct) if not c)
    assert all(-1.0 <= t <= 1.0 for t in term)
    right = [(n, t) for n, t, c in zip(lengths, term, correct) if c]
    assert all(t1 >= t2 for n1, t1 in right for n2, t2 in right if n1 < n2)  # shorter never worse
    totals = [float(c) + weight * t for c, t in zip(correct, term)]
    if any(correct) and not all(correct):
        assert min(t for t, c in zip(totals, correct) if c) > max(t for t, c in zip(totals, correct) if not c)
