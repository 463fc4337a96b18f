"""Decay-emulating merge coefficients: a weighted average of stable-phase checkpoints that
behaves like having decayed the learning rate (ALGORITHMS.md §2).

Sources: WSM, "Weighted checkpoint merging emulates decay" (Tian et al., 2025,
arXiv:2507.17634, "WSM: Decay-Free Learning Rate Schedule via Checkpoint Merging for LLM
Pre-training"), and Megatron-LM's weighted checkpoint merge as used for Nemotron 3.

Why it works: with checkpoints θ₀ … θₙ₋₁ (oldest first) a merge Σ cⱼ θⱼ equals
θ₀ + Σᵢ wᵢ (θᵢ − θᵢ₋₁) with wᵢ = Σ_{j≥i} cⱼ: update segment i counts with weight wᵢ, as if it
had been taken at LR·wᵢ. Choosing wᵢ = f(i/n) for a decay shape f with f(0) = 1 gives

    c₀ = 1 − f(1/n);   cᵢ = f(i/n) − f((i+1)/n)  (1 ≤ i ≤ n−2);   cₙ₋₁ = f((n−1)/n)

which sum to 1 and are ≥ 0 for a non-increasing f. n = 1 gives [1.0].
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stagewise.model.merge.errors import MergeInputError

Shape = Callable[[float], float]


def minus_sqrt(x: float) -> float:
    """f(x) = 1 − √x: the shape of Nemotron 3's LR decay (ALGORITHMS.md §1), the default."""
    return 1.0 - math.sqrt(x)


def linear(x: float) -> float:
    """f(x) = 1 − x: every cᵢ = 1/n, i.e. the plain average (a check on the formula)."""
    return 1.0 - x


def cosine(x: float) -> float:
    """f(x) = ½(1 + cos πx): the cosine decay shape."""
    return 0.5 * (1.0 + math.cos(math.pi * x))


def decay_coefficients(n: int, shape: Shape) -> list[float]:
    """Coefficients of n checkpoints, oldest first, for the decay shape `shape` (formula above)."""
    if n < 1:
        raise MergeInputError(f"a merge needs at least one checkpoint, got n={n}")
    if n == 1:
        return [1.0]
    w = [shape(i / n) for i in range(n)]  # w[i] = f(i/n): the weight of update segment i (w[0] = 1)
    coeffs = [1.0 - w[1]] + [w[i] - w[i + 1] for i in range(1, n - 1)] + [w[n - 1]]
    if min(coeffs) < -1e-12:
        raise MergeInputError(f"decay shape {shape.__name__} is not non-increasing: coefficients {coeffs}")
    return coeffs
