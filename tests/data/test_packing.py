"""Best-fit decreasing: the ALGORITHMS.md example, invariants, efficiency, and one pack's tensors."""

from __future__ import annotations

import numpy as np
import pytest

from stagewise.data.packing import IGNORE, best_fit_decreasing, pack_row, pack_rows, supervised_count

EXAMPLE = [3000, 2500, 1800, 1500, 1200, 900, 700, 400, 300, 100]


def lengths_of(report, lengths):
    return [[lengths[i] for i in pack] for pack in report.packs]


def test_algorithms_md_example():
    report = best_fit_decreasing(EXAMPLE, 4096)
    assert lengths_of(report, EXAMPLE) == [[3000, 900, 100], [2500, 1500], [1800, 1200, 700, 300], [400]]
    assert report.efficiency == pytest.approx(sum(EXAMPLE) / (4 * 4096))
    assert report.dropped == 0


def test_example_does_not_depend_on_input_order():
    rng = np.random.default_rng(0)
    shuffled = [int(x) for x in rng.permutation(EXAMPLE)]
    assert lengths_of(best_fit_decreasing(shuffled, 4096), shuffled) == [[3000, 900, 100], [2500, 1500],
                                                                         [1800, 1200, 700, 300], [400]]


def test_ties_go_to_the_lowest_pack_index():
    # two packs with equal room 4 after [6], [6]: the 4 must go to pack 0
    report = best_fit_decreasing([6, 6, 4], 10)
    assert report.packs == [[0, 2], [1]]


def test_too_long_is_dropped_and_counted_never_split():
    report = best_fit_decreasing([5000, 10, 4097, 4096], 4096, supervised=[1, 2, 3, 4])
    assert report.dropped == 2 and report.dropped_items == [0, 2]
    assert sorted(i for p in report.packs for i in p) == [1, 3]
    assert report.supervised_tokens == 6


def test_same_prompt_never_twice_in_a_pack():
    # the best fit for the second "p" is the pack holding the first "p": it opens a new pack,
    # and "q" then takes the room the rule left in pack 0
    assert best_fit_decreasing([6, 4, 4], 10, keys=["p", "p", "q"]).packs == [[0, 2], [1]]
    assert best_fit_decreasing([6, 4, 4], 10).packs == [[0, 1], [2]]
    # the next best is tried before a new pack is opened
    assert best_fit_decreasing([7, 5, 3], 10, keys=["p", "q", "p"]).packs == [[0], [1, 2]]
    assert best_fit_decreasing([5, 5], 10, keys=["a", "a"]).packs == [[0], [1]]
    assert best_fit_decreasing([5, 5], 10).packs == [[0, 1]]


def realistic(n: int, pack_size: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    short = np.clip(rng.lognormal(np.log(300), 0.8, n), 10, pack_size).astype(int)
    long = rng.integers(1000, pack_size + 1, n)
    return np.where(rng.random(n) < 0.9, short, long).tolist()


def test_invariants_and_efficiency_on_a_realistic_mix():
    lengths = realistic(5000, 4096)
    keys = [i % 1500 for i in range(5000)]  # some prompts appear up to 4 times
    report = best_fit_decreasing(lengths, 4096, keys)
    placed = [i for pack in report.packs for i in pack]
    assert sorted(placed) == list(range(5000))  # every item exactly once, none split or dropped
    for pack in report.packs:
        assert sum(lengths[i] for i in pack) <= 4096
        assert len({keys[i] for i in pack}) == len(pack)
    assert report.efficiency >= 0.99


def test_pack_row_by_hand():
    # doc A: ids 10 11 12 13, supervised 12 13; doc B: ids 20 21 22, supervised 21 22
    row = pack_row([([10, 11, 12, 13], [0, 0, 1, 1]), ([20, 21, 22], [0, 1, 1])], pack_size=10, pad_id=0)
    assert row["input_ids"].tolist() == [10, 11, 12, 13, 20, 21, 22, 0, 0, 0]
    assert row["labels"].tolist() == [IGNORE, 12, 13, IGNORE, 21, 22, IGNORE, IGNORE, IGNORE, IGNORE]
    assert row["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]
    assert row["seq_idx"].tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert row["seq_idx"].dtype == np.int32
    assert supervised_count([0, 0, 1, 1]) + supervised_count([0, 1, 1]) == int((row["labels"] != IGNORE).sum())


def test_pack_row_full_and_overflow():
    full = pack_row([([1, 2, 3], [0, 1, 1])], pack_size=3, pad_id=0)
    assert full["labels"].tolist() == [2, 3, IGNORE] and full["seq_idx"].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="overflow"):
        pack_row([([1, 2, 3], [0, 1, 1])], pack_size=2, pad_id=0)


def test_pack_rows_follow_the_report():
    encoded = [([5] * n, [0] + [1] * (n - 1)) for n in (6, 3, 5, 2)]
    report = best_fit_decreasing([len(e[0]) for e in encoded], 8, supervised=[supervised_count(m) for _, m in encoded])
    rows = pack_rows(encoded, report, pad_id=0)
    assert rows["input_ids"].shape == (len(report.packs), 8)
    assert int((rows["labels"] != IGNORE).sum()) == report.supervised_tokens == 5 + 2 + 4 + 1
