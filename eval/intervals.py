"""How sure a held-out number is: 95% intervals for a rate and for a before -> after gain, and the
verdict a gain's interval supports.

Why: the held-out sets here are small (a few hundred RL prompts, tens to a couple of hundred
conversations), so one answer moves a rate by 0.003-0.05, and a threshold on a point estimate
flaps. Every stage that claims a gain scores the same items before and after, so the gain's
interval is a *paired* bootstrap: items are resampled with replacement and the mean of (after -
before) over each resample taken; the 2.5th and 97.5th percentiles are the bounds. An item is one
prompt (RL: its score is the mean over its samples, so resampling prompts keeps a prompt's samples
together, the cautious choice when they are correlated) or one conversation (exact match, 0 or 1).
A single rate of 0/1 items gets Wilson's score interval; a rate of fractional items (pass@1 over
samples) the bootstrap of its mean.

The resampling is seeded (`seed`), so a report is reproducible to the digit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
RESAMPLES = 4000

VERDICTS = ("better", "worse", "kept", "not distinguishable")
"""better / worse: the gain's interval excludes zero (on the good / bad side); kept: it includes zero
and its bad end is within the stage's tolerance (quantization: `max_drop`); not distinguishable:
anything else (an interval across zero, with no tolerance to be kept within)."""


@dataclass(frozen=True)
class Gain:
    """after - before over the items both were scored on, with its interval."""

    gain: float
    low: float
    high: float
    items: int


@dataclass(frozen=True)
class Scored:
    """An evaluation's metrics and, for the metrics scored per item, each item's score (metric ->
    item id -> score): what a paired gain and a rate's interval are computed from."""

    metrics: dict[str, float]
    items: dict[str, dict[str, float]] = field(default_factory=dict)

    def __or__(self, other: "Scored") -> "Scored":
        return Scored(self.metrics | other.metrics, self.items | other.items)


def _z(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval of a binomial rate (stays inside [0, 1] and is not empty at 0 or n)."""
    if n <= 0:
        raise ValueError("a rate of no items has no interval")
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    z = _z(level)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _bootstrap_means(values: np.ndarray, seed: int, resamples: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    return values[picks].mean(axis=1)


def _percentiles(means: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def rate_interval(scores: Sequence[float], level: float = LEVEL, seed: int = 0,
                  resamples: int = RESAMPLES) -> tuple[float, float]:
    """The interval of a mean of per-item scores in [0, 1]: Wilson's when every score is 0 or 1,
    else the percentile bootstrap over items."""
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0:
        raise ValueError("a rate of no items has no interval")
    if np.all((values == 0) | (values == 1)):
        return wilson(int(values.sum()), int(values.size), level)
    return _percentiles(_bootstrap_means(values, seed, resamples), level)


def paired_gain(before: Mapping[str, float], after: Mapping[str, float], level: float = LEVEL, seed: int = 0,
                resamples: int = RESAMPLES) -> Gain | None:
    """after - before over the items in both (matched by item id), with the paired percentile
    bootstrap's interval; None when no item is in both."""
    shared = sorted(set(before) & set(after))
    if not shared:
        return None
    diffs = np.asarray([after[k] - before[k] for k in shared], dtype=np.float64)
    low, high = _percentiles(_bootstrap_means(diffs, seed, resamples), level)
    return Gain(float(diffs.mean()), low, high, len(shared))


def verdict(low: float | None, high: float | None, higher_is_better: bool,
            tolerance: float | None = None) -> str | None:
    """One of VERDICTS for a gain's interval [low, high] (None without one)."""
    if low is None or high is None:
        return None
    worst, best = (low, high) if higher_is_better else (-high, -low)  # in "improvement" units
    if worst > 0:
        return "better"
    if best < 0:
        return "worse"
    if tolerance is not None and worst >= -tolerance:
        return "kept"
    return "not distinguishable"


def gain_fields(before: Mapping[str, float] | None, after: Mapping[str, float] | None, higher_is_better: bool,
                tolerance: float | None = None) -> dict:
    """A closing-table row's evidence (StageSummary's gain_low, gain_high, items, tolerance, verdict)
    from the per-item scores of its metric before and after; {} where either is missing."""
    gain = paired_gain(before or {}, after or {})
    if gain is None:
        return {}
    return {"gain_low": gain.low, "gain_high": gain.high, "items": gain.items, "tolerance": tolerance,
            "verdict": verdict(gain.low, gain.high, higher_is_better, tolerance)}


def describe_change(row: Mapping) -> tuple[str, str]:
    """(text, verdict) of a closing-table row's change after - before: `+0.035 [+0.012, +0.058]` and
    its interval's verdict; a row without an interval (a loss over thousands of tokens, a merge's
    score) gets the point change and `better` / `worse` by its direction ('' when unchanged);
    ('', '') without both numbers."""
    before, after = row.get("before"), row.get("after")
    if before is None or after is None:
        return "", ""
    text = f"{after - before:+.3g}"
    if row.get("gain_low") is not None:
        return f"{text} [{row['gain_low']:+.3g}, {row['gain_high']:+.3g}]", row.get("verdict") or ""
    if after == before or row.get("higher_is_better") is None:
        return text, ""
    return text, "better" if (after > before) == bool(row["higher_is_better"]) else "worse"
