"""Window selection in tokens: inclusive ends, and windows that do not fit yet."""

from pathlib import Path

import pytest

from stagewise.model.merge import MergeInputError, select_window

CKPTS = [(Path(f"step-{i:03d}"), 25 * i) for i in range(1, 13)]  # 25, 50, ..., 300 tokens


def test_inclusive_window_holds_interval_count_plus_one():
    w = select_window(CKPTS, end=Path("step-010"), window_tokens=125)  # 250 - 125 = 125
    assert w.fits and [t for _, t in w.members] == [125, 150, 175, 200, 225, 250]
    assert w.paths[0] == Path("step-005") and w.start_tokens == 125 and w.end_tokens == 250


def test_end_by_index_and_unsorted_input():
    w = select_window(list(reversed(CKPTS)), end=0, window_tokens=50)  # index into the list as given: step-012
    assert [t for _, t in w.members] == [250, 275, 300]


def test_window_that_does_not_fit_yet_gives_none_and_why():
    w = select_window(CKPTS, end=Path("step-004"), window_tokens=100)  # starts at 0, oldest is 25
    assert not w.fits and w.members is None
    assert "does not fit yet" in w.reason and "step-001" in w.reason


def test_window_starting_exactly_at_the_oldest_fits():
    w = select_window(CKPTS, end=Path("step-005"), window_tokens=100)
    assert [t for _, t in w.members] == [25, 50, 75, 100, 125]


def test_pruned_checkpoints_make_a_long_window_not_fit():
    kept = CKPTS[-3:]  # keep_checkpoints=3: 250, 275, 300
    assert not select_window(kept, end=-1, window_tokens=100).fits
    assert select_window(kept, end=-1, window_tokens=50).fits


def test_zero_window_is_the_end_checkpoint_alone():
    assert select_window(CKPTS, end=Path("step-003"), window_tokens=0).members == [(Path("step-003"), 75)]


def test_unknown_end_is_refused():
    with pytest.raises(MergeInputError, match="not among"):
        select_window(CKPTS, end=Path("nope"), window_tokens=10)
