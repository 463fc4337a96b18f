"""Repetition filters: windowed n-gram counts, the repeated fraction, and thresholds from config."""

from __future__ import annotations

import random

import pytest

from stagewise.data.curate.repetition import check_repetition, max_in_window, repeated_fraction, window_repeats
from stagewise.data.curate.structural import Rejected
from stagewise.data.sft_config import CurateConfig


def conv(answer: str, reasoning: str | None = None) -> dict:
    a = {"role": "assistant", "content": answer}
    if reasoning:
        a["reasoning_content"] = reasoning
    return {"messages": [{"role": "user", "content": "Go."}, a]}


def test_max_in_window_by_hand():
    assert max_in_window([0, 5, 9, 30, 31, 32], span=10) == 3   # 0,5,9 or 30,31,32
    assert max_in_window([0, 11, 22], span=10) == 1
    assert max_in_window([], span=10) == 0


def test_window_repeats_counts_only_inside_the_window():
    toks = ("a b " * 3).split() + [f"x{i}" for i in range(20)] + ("a b " * 2).split()
    assert window_repeats(toks, 2, window=10)[0] == 3
    assert window_repeats(toks, 2, window=100) == (5, ("a", "b"))


def test_repeated_fraction_by_hand():
    assert repeated_fraction("a b a b a b".split(), 2) == pytest.approx(1 - 2 / 5)  # ab ba ab ba ab
    assert repeated_fraction("a b c d".split(), 2) == 0.0
    assert repeated_fraction(["a"], 2) == 0.0


def test_loop_in_a_long_healthy_trace_is_caught():
    rng = random.Random(0)
    healthy = " ".join(rng.choice([f"w{i}" for i in range(300)]) for _ in range(400))
    loop = "so the answer is 4 " * 8
    cfg = CurateConfig(repeat_ngram=4, repeat_window=100, repeat_max_count=6)
    check_repetition(conv("The total is 5460.", healthy), cfg)
    with pytest.raises(Rejected) as e:
        check_repetition(conv("The total is 5460.", healthy + " " + loop), cfg)
    assert e.value.reason == "repetition_window"


def test_window_threshold_comes_from_config():
    text = "one two three four " * 5  # the 4-gram occurs 5 times
    check_repetition(conv(text), CurateConfig(repeat_max_count=5, repeat_max_fraction=1.0))
    with pytest.raises(Rejected):
        check_repetition(conv(text), CurateConfig(repeat_max_count=4, repeat_max_fraction=1.0))


def test_repeated_fraction_filter():
    # a trace that cycles through 3 sentences: never 7 repeats in 100 words, but mostly repeats
    cycle = ["the red fox runs home", "a blue bird sings loud", "one green frog jumps high"]
    text = " ".join(cycle[i % 3] + f" {i // 9}" for i in range(30))
    cfg = CurateConfig(repeat_max_count=50, repeat_max_fraction=0.5, repeat_min_words=32)
    with pytest.raises(Rejected) as e:
        check_repetition(conv(text), cfg)
    assert e.value.reason == "repetition_fraction"
    check_repetition(conv(text), cfg.model_copy(update={"repeat_max_fraction": 0.9}))


def test_short_answers_are_not_judged_by_fraction():
    check_repetition(conv("4 4 4 4 4"), CurateConfig(repeat_ngram=1, repeat_max_fraction=0.1, repeat_max_count=10))


def test_only_assistant_turns_are_checked():
    spam = "buy now " * 50
    c = {"messages": [{"role": "user", "content": spam}, {"role": "assistant", "content": "No."}]}
    check_repetition(c, CurateConfig())
