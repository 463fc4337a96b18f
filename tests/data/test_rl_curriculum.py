"""The difficulty filter and Gaussian curriculum of ALGORITHMS.md section 6, against
hand-computed values, plus properties every batch must have."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.data.rl_curriculum import (
    CurriculumConfig,
    bin_counts,
    bin_shares,
    curriculum_mu,
    difficulty_filter,
    largest_remainder,
    pass_rate_bin,
    sample_batch,
)

CFG = CurriculumConfig()


def test_shares_at_mu_one_half_match_the_algorithms_example():
    shares = bin_shares(0.5, 0.15, 8)
    assert [round(s, 3) for s in shares] == [0.001, 0.015, 0.083, 0.235, 0.333, 0.235, 0.083, 0.015]
    assert sum(shares) == pytest.approx(1.0)


def test_shares_never_divide_by_zero_far_from_the_bins():
    shares = bin_shares(40.0, 0.01, 8)
    assert shares[-1] == pytest.approx(1.0) and sum(shares) == pytest.approx(1.0)


def test_mu_moves_linearly_from_start_to_end():
    assert curriculum_mu(0, 5, CFG) == 0.875
    assert curriculum_mu(2, 5, CFG) == pytest.approx(0.5)
    assert curriculum_mu(4, 5, CFG) == pytest.approx(0.125)
    assert curriculum_mu(9, 5, CFG) == pytest.approx(0.125)  # clamped
    assert curriculum_mu(3, 1, CFG) == 0.875
    with pytest.raises(ValueError, match="total_steps"):
        curriculum_mu(0, 0, CFG)


def test_filter_drops_solved_and_keeps_and_counts_unsolved():
    rates = {"a": 1.0, "b": 0.0, "c": 0.5, "d": 0.0, "e": 15 / 16}
    assert difficulty_filter(rates) == (["b", "c", "d", "e"],
                                        {"kept": 4, "dropped_solved": 1, "dropped_unsolved": 0, "unsolved_kept": 2})
    assert difficulty_filter(rates, drop_unsolved=True) == (
        ["c", "e"], {"kept": 2, "dropped_solved": 1, "dropped_unsolved": 2, "unsolved_kept": 0})
    assert difficulty_filter(rates, drop_solved=False)[0] == ["a", "b", "c", "d", "e"]
    with pytest.raises(ValueError, match="'x'"):
        difficulty_filter({"x": 1.5})


def test_bins_of_pass_rates():
    assert [pass_rate_bin(k / 16, 8) for k in range(17)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7]


def test_largest_remainder_by_hand():
    assert largest_remainder(7, [0.5, 0.3, 0.2]) == [4, 2, 1]  # 3.5 2.1 1.4 -> the .5 gets the last one
    assert largest_remainder(10, [1, 1, 1, 1]) == [3, 3, 2, 2]  # ties: the lower index
    assert largest_remainder(3, [0, 2, 1]) == [0, 2, 1]


def test_bin_counts_cap_and_give_the_shortfall_to_the_bins_nearest_the_mean():
    # mu = 0.875: shares ~ [0, 0, 0, .0019, .0219, .1245, .3526, .4990]; n = 8 -> 3.99 2.82 .996 -> [.., 1, 3, 4]
    shares = bin_shares(0.875, 0.15, 8)
    assert bin_counts(8, shares, [99] * 8) == [0, 0, 0, 0, 0, 1, 3, 4]
    # bin 7 holds 2: shortfall 2, both to bin 6 (the next largest share, 2 left), not to the full bin 0
    assert bin_counts(8, shares, [10, 0, 0, 0, 0, 5, 5, 2]) == [0, 0, 0, 0, 0, 1, 5, 2]
    # bin 6 runs out too: then bin 5, and bin 0 only when nothing nearer is left
    assert bin_counts(8, shares, [10, 0, 0, 0, 0, 1, 1, 2]) == [4, 0, 0, 0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        bin_counts(5, shares, [1, 1, 1, 0, 0, 0, 0, 0])


def pool(domain: str, per_bin: dict[int, int]) -> list[tuple[str, float]]:
    """Prompts named <domain>/b<bin>/<i> with a pass rate in the middle of their bin."""
    return [(f"{domain}/b{b}/{i}", b / 8 + 1 / 16) for b, n in per_bin.items() for i in range(n)]


def bin_of(pid: str) -> int:
    return int(pid.split("/")[1][1:])


def test_sample_batch_by_hand_at_the_first_step():
    prompts = {"x": pool("x", {0: 10, 5: 5, 6: 5, 7: 2})}
    batch = sample_batch(prompts, {"x": 1.0}, 8, step=0, total_steps=10, cfg=CFG, rng=random.Random(0))
    assert Counter(bin_of(p) for p in batch) == {5: 1, 6: 5, 7: 2}  # the shortfall stays near mu = 0.875
    assert len(set(batch)) == 8


def test_domain_counts_are_fixed_at_every_step_and_bins_follow_mu():
    prompts = {d: pool(d, {b: 6 for b in range(8)}) for d in ("a", "b", "c")}
    ratios = {"a": 0.5, "b": 0.3, "c": 0.2}
    rng = random.Random(1)
    means = []
    for step in range(5):
        batch = sample_batch(prompts, ratios, 7, step, 5, CFG, rng)
        assert Counter(p.split("/")[0] for p in batch) == {"a": 4, "b": 2, "c": 1}
        means.append(sum(bin_of(p) for p in batch) / len(batch))
    assert means[0] > 5 and means[-1] < 2  # easy first (high pass rate), hard last


def test_deterministic_for_a_given_rng_and_shuffled():
    prompts = {"a": pool("a", {b: 20 for b in range(8)}), "b": pool("b", {3: 30})}
    args = (prompts, {"a": 3, "b": 1}, 32, 2, 5, CFG)
    first = sample_batch(*args, random.Random(7))
    assert first == sample_batch(*args, random.Random(7))
    assert first != sample_batch(*args, random.Random(8))
    assert [p.split("/")[0] for p in first] != sorted(p.split("/")[0] for p in first)  # domains interleaved


def test_a_small_domain_repeats_every_prompt_before_any_twice_more():
    prompts = {"s": pool("s", {2: 2, 4: 1})}
    batch = sample_batch(prompts, {"s": 1.0}, 7, 0, 1, CFG, random.Random(0))
    assert sorted(Counter(batch).values()) == [2, 2, 3]  # 2 full rounds of 3, then 1 more


def test_bad_inputs_name_the_domain():
    with pytest.raises(ValueError, match="'z'"):
        sample_batch({"a": pool("a", {1: 3})}, {"a": 1, "z": 1}, 4, 0, 3, CFG, random.Random(0))
    with pytest.raises(ValueError, match="a/q"):
        sample_batch({"a": [("q", -0.1)]}, {"a": 1}, 1, 0, 3, CFG, random.Random(0))
    with pytest.raises(ValueError):
        CurriculumConfig(sigma=0)


@settings(max_examples=60, deadline=None)
@given(holds=st.dictionaries(st.sampled_from(["a", "b", "c"]),
                             st.lists(st.integers(0, 6), min_size=8, max_size=8), min_size=1),
       batch_size=st.integers(1, 40), step=st.integers(0, 9), seed=st.integers(0, 3))
def test_every_batch_has_the_right_size_domains_and_caps(holds, batch_size, step, seed):
    prompts = {d: pool(d, dict(enumerate(h))) for d, h in holds.items() if sum(h) > 0}
    if not prompts:
        return
    ratios = {d: i + 1.0 for i, d in enumerate(prompts)}
    batch = sample_batch(prompts, ratios, batch_size, step, 10, CFG, random.Random(seed))
    assert len(batch) == batch_size
    want = dict(zip(ratios, largest_remainder(batch_size, list(ratios.values()))))
    got = Counter(p.split("/")[0] for p in batch)
    assert {d: got.get(d, 0) for d in ratios} == want
    for d, n in want.items():
        if n <= len(prompts[d]):  # enough prompts: no repeats
            assert len({p for p in batch if p.startswith(d + "/")}) == n
