"""Merge coefficients (ALGORITHMS.md §2): hand-computed values, sums, orderings, the registry."""

import math

import pytest

from stagewise.model.merge import SCHEDULES, MergeInputError, merge_coefficients


def test_minus_sqrt_n5_matches_the_published_values():
    assert [round(c, 4) for c in merge_coefficients(5)] == [0.4472, 0.1852, 0.1421, 0.1198, 0.1056]


def test_minus_sqrt_n10_matches_the_published_values():
    want = [0.3162, 0.1310, 0.1005, 0.0847, 0.0747, 0.0675, 0.0621, 0.0578, 0.0543, 0.0513]
    assert [round(c, 4) for c in merge_coefficients(10, "minus-sqrt")] == want


def test_n1_is_the_checkpoint_itself():
    for schedule in SCHEDULES:
        assert merge_coefficients(1, schedule) == [1.0]


def test_n2_by_hand():
    # minus-sqrt: w1 = f(1/2) = 1 - sqrt(.5); c0 = 1 - w1 = sqrt(.5), c1 = w1
    c0, c1 = merge_coefficients(2, "minus-sqrt")
    assert c0 == pytest.approx(math.sqrt(0.5)) and c1 == pytest.approx(1 - math.sqrt(0.5))
    assert merge_coefficients(2, "linear") == pytest.approx([0.5, 0.5])
    assert merge_coefficients(2, "cosine") == pytest.approx([0.5, 0.5])  # f(1/2) = 1/2
    assert merge_coefficients(2, "uniform") == [0.5, 0.5]


def test_cosine_n4_by_hand():
    f = lambda x: 0.5 * (1 + math.cos(math.pi * x))  # noqa: E731
    want = [1 - f(0.25), f(0.25) - f(0.5), f(0.5) - f(0.75), f(0.75)]
    assert merge_coefficients(4, "cosine") == pytest.approx(want)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 37])
def test_coefficients_sum_to_one_and_are_non_negative(schedule, n):
    c = merge_coefficients(n, schedule)
    assert len(c) == n and math.isclose(sum(c), 1.0, abs_tol=1e-12) and min(c) >= 0


def test_linear_is_the_plain_average():
    assert merge_coefficients(7, "linear") == pytest.approx(merge_coefficients(7, "uniform"))


def test_minus_sqrt_puts_most_weight_on_the_oldest_and_decreases():
    c = merge_coefficients(8)
    assert c == sorted(c, reverse=True)


def test_reversed_applies_coefficients_newest_first():
    seq = merge_coefficients(5)
    assert merge_coefficients(5, ordering="reversed") == seq[::-1]


def test_random_ordering_is_a_seeded_permutation():
    seq = merge_coefficients(6)
    a = merge_coefficients(6, ordering="random", seed=1)
    assert sorted(a) == sorted(seq) and a == merge_coefficients(6, ordering="random", seed=1)
    others = {tuple(merge_coefficients(6, ordering="random", seed=s)) for s in range(2, 8)}
    assert len(others | {tuple(a)}) > 1


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(MergeInputError, match="minus-sqrt"):
        merge_coefficients(3, "sqrt")
    with pytest.raises(MergeInputError, match="reversed"):
        merge_coefficients(3, ordering="backwards")
    with pytest.raises(MergeInputError):
        merge_coefficients(0)
