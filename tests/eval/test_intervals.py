"""Intervals for held-out rates and gains (eval/intervals.py), against values worked by hand."""

from __future__ import annotations

import pytest

from stagewise.eval.intervals import paired_gain, rate_interval, verdict, wilson


def test_wilson_matches_the_textbook_values():
    # 5/10: centre (0.5 + 1.96^2/20) / (1 + 1.96^2/10) = 0.5, half 1.96 sqrt(0.025 + 0.0096) / 1.38416
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    # 0/10: the upper bound is z^2 / (n + z^2), the lower exactly 0 (not an empty interval)
    assert wilson(0, 10) == pytest.approx((0.0, 3.8415 / 13.8415), abs=1e-4)
    assert wilson(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson(3, 0)


def test_a_rate_of_0_1_items_is_wilsons_and_of_fractions_a_bootstrap_around_the_mean():
    assert rate_interval([1, 0, 1, 0, 1, 0, 1, 0, 1, 0]) == wilson(5, 10)
    low, high = rate_interval([0.25] * 50 + [0.75] * 50, seed=1)
    assert low < 0.5 < high and high - low == pytest.approx(2 * 1.96 * 0.25 / 10, rel=0.15)  # mean's sd: 0.25/sqrt(100)
    assert rate_interval([0.4] * 20) == pytest.approx((0.4, 0.4))


def test_a_paired_gain_uses_the_pairs():
    # items whose levels vary from 0 to 1, each 0.02 better after: unpaired the spread would swamp 0.02,
    # paired every difference is 0.02, so the interval is exactly [0.02, 0.02]
    before = {f"p{i}": i / 49 * 0.9 for i in range(50)}
    after = {k: v + 0.02 for k, v in before.items()}
    gain = paired_gain(before, after)
    assert gain.items == 50 and gain.gain == pytest.approx(0.02)
    assert (gain.low, gain.high) == pytest.approx((0.02, 0.02))
    assert verdict(gain.low, gain.high, higher_is_better=True) == "better"


def test_a_gain_of_60_of_100_items_has_the_binomial_width_and_items_are_matched_by_id():
    before = {f"q{i}": 0.0 for i in range(100)}
    after = {f"q{i}": float(i < 60) for i in range(100)} | {"only-after": 1.0}
    gain = paired_gain(before, after, seed=3)
    assert gain.items == 100 and gain.gain == pytest.approx(0.6)
    # sd of the mean of 0/1 differences at p = 0.6: sqrt(0.24 / 100) = 0.049; 95% about +-0.096
    assert 0.49 < gain.low < 0.53 and 0.67 < gain.high < 0.71
    assert paired_gain({"a": 1.0}, {"b": 1.0}) is None
    assert paired_gain(before, after, seed=3) == gain  # seeded: the same report twice


@pytest.mark.parametrize("low, high, higher, tolerance, expected", [
    (0.01, 0.2, True, None, "better"),
    (-0.2, -0.01, True, None, "worse"),
    (-0.03, 0.05, True, None, "not distinguishable"),
    (-0.03, 0.05, True, 0.05, "kept"),
    (-0.08, 0.05, True, 0.05, "not distinguishable"),
    # lower is better (a loss): a negative change is the good side
    (-0.2, -0.01, False, None, "better"),
    (0.01, 0.2, False, None, "worse"),
    (-0.01, 0.02, False, 0.03, "kept"),
    (None, None, True, None, None),
])
def test_the_verdict_follows_from_the_interval(low, high, higher, tolerance, expected):
    assert verdict(low, high, higher, tolerance) == expected
