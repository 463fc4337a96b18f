"""Orderings of merge coefficients over the checkpoints, for ablations (ALGORITHMS.md §2).

A schedule yields coefficients by position, oldest checkpoint first. `sequential` keeps
them (the decay emulation); `reversed` applies them newest-first (the largest weight on
the newest checkpoint: it tests whether the emulated decay, not just averaging, helps);
`random` applies a permutation seeded by `seed` (same seed, same permutation). Every
ordering is a permutation, so the sum stays 1.
"""

from __future__ import annotations

import random

from stagewise.model.merge.errors import MergeInputError

ORDERINGS = ("sequential", "reversed", "random")


def apply_ordering(coeffs: list[float], ordering: str, seed: int = 0) -> list[float]:
    """The coefficients re-assigned to checkpoints (oldest first) by `ordering`."""
    if ordering == "sequential":
        return list(coeffs)
    if ordering == "reversed":
        return list(reversed(coeffs))
    if ordering == "random":
        order = list(range(len(coeffs)))
        random.Random(f"merge-ordering:{seed}").shuffle(order)
        return [coeffs[i] for i in order]
    raise MergeInputError(f"unknown ordering {ordering!r}; orderings: {', '.join(ORDERINGS)}")
