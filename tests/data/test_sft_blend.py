"""SFT blends: counts and realised mixture, seeding, epoch caps, and add_domain's proportional slice."""

from __future__ import annotations

import pytest

from stagewise.data.sft_blend import add_domain, largest_remainder, sample_blend


def pools(sizes: dict[str, int]) -> dict[str, list[dict]]:
    return {d: [{"id": f"{d}-{i}"} for i in range(n)] for d, n in sizes.items()}


def test_counts_follow_weights_and_sum_to_n():
    result = sample_blend(pools({"math": 500, "chat": 500, "tools": 500}), {"math": 2, "chat": 1, "tools": 1}, seed=0, n=400)
    assert result.counts == {"math": 200, "chat": 100, "tools": 100}
    assert len(result.conversations) == 400
    assert result.realised == {"math": 0.5, "chat": 0.25, "tools": 0.25}
    assert [c["id"].split("-")[0] for c in result.conversations] == result.domains
    assert len({c["id"] for c in result.conversations}) == 400  # no repeats within one epoch


def test_seeded():
    p, w = pools({"a": 100, "b": 100}), {"a": 1, "b": 3}
    ids = lambda seed: [c["id"] for c in sample_blend(p, w, seed=seed, n=80).conversations]  # noqa: E731
    assert ids(1) == ids(1) and ids(1) != ids(2)


def test_default_n_and_epoch_caps():
    p = pools({"big": 1000, "small": 50})
    result = sample_blend(p, {"big": 1, "small": 1}, seed=0)  # small runs out first: 50 + 50
    assert result.counts == {"big": 50, "small": 50}
    capped = sample_blend(p, {"big": 1, "small": 1}, seed=0, n=400, max_epochs=2.0)
    assert capped.counts == {"big": 200, "small": 100}  # small capped at 2 epochs; the realised mix says so
    assert capped.realised["small"] == pytest.approx(1 / 3) and capped.epochs["small"] == 2.0
    twice = [c["id"] for c in capped.conversations if c["id"].startswith("small")]
    assert len(set(twice)) == 50 and len(twice) == 100


def test_largest_remainder_sums_exactly():
    counts = largest_remainder({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 100)
    assert sum(counts.values()) == 100 and sorted(counts.values()) == [33, 33, 34]


def test_add_domain_takes_a_proportional_slice():
    old = {"math": 0.5, "chat": 0.3, "tools": 0.2}
    new = add_domain(old, "long_context", 0.1)
    assert new == pytest.approx({"math": 0.45, "chat": 0.27, "tools": 0.18, "long_context": 0.1})
    # the old domains keep their relative mixture
    assert new["math"] / new["chat"] == pytest.approx(old["math"] / old["chat"])
    assert add_domain({"a": 2, "b": 2}, "a", 0.2) == pytest.approx({"b": 0.8, "a": 0.2})
    with pytest.raises(ValueError):
        add_domain(old, "x", 1.0)


def test_unknown_domain_is_an_error():
    with pytest.raises(ValueError, match="ghost"):
        sample_blend(pools({"a": 10}), {"a": 1, "ghost": 1}, seed=0, n=5)
