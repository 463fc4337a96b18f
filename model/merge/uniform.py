"""Uniform averaging: every checkpoint of the window weighs 1/n.

Sources: LAWA, "Stop Wasting My Time! Saving Days of ImageNet and BERT Training with
Latest Weight Averaging" (Kaddour, 2022, arXiv:2209.14981), and model soups (Wortsman et
al., 2022, arXiv:2203.05482). The baseline the decay-emulating schedules are compared to;
equal to WSM's `linear` shape, computed directly so it is exact.
"""

from __future__ import annotations

from stagewise.model.merge.errors import MergeInputError


def uniform_coefficients(n: int) -> list[float]:
    """[1/n] * n."""
    if n < 1:
        raise MergeInputError(f"a merge needs at least one checkpoint, got n={n}")
    return [1.0 / n] * n
