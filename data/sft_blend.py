"""Per-domain SFT mixtures: weights -> a seeded sample of conversations, and adding a domain.

    result = sample_blend(pools, {"math": 2, "tools": 1}, n=3000, seed=0)
    result.conversations, result.realised        # the sample and its mixture, for logging
    weights = add_domain(weights, "long_context", 0.1)

`sample_blend` gives each domain round(share x n) conversations (largest remainders, so the
counts add up to n), drawn from seeded per-domain permutations, whole passes first, never
more than `max_epochs` passes over a domain: a domain that runs short is capped and the
realised mixture says so. `add_domain` makes room for a new domain by taking the same
fraction from every other domain (each keeps its share x (1 - share_new)), so the
relative mixture of the old domains is unchanged and the stage's behaviour on them moves
as little as possible.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class BlendResult:
    """A sampled mixture."""

    conversations: list[dict]
    domains: list[str]
    """Domain of each sampled conversation (parallel to `conversations`)."""
    counts: dict[str, int]
    requested: dict[str, float]
    """The normalised weights asked for."""
    realised: dict[str, float]
    """Share of the sample per domain."""
    epochs: dict[str, float]
    """Draws / pool size per domain (> 1 means some conversations appear more than once)."""

    def to_dict(self) -> dict:
        return {"counts": self.counts, "requested": self.requested, "realised": self.realised, "epochs": self.epochs}


def normalise(weights: Mapping[str, float]) -> dict[str, float]:
    """Weights scaled to sum to 1 (ValueError on negative or all-zero weights)."""
    if any(w < 0 for w in weights.values()):
        raise ValueError(f"weights must be >= 0, got {dict(weights)}")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("weights must not all be zero")
    return {k: w / total for k, w in weights.items()}


def add_domain(weights: Mapping[str, float], new_domain: str, share: float) -> dict[str, float]:
    """Normalised weights with `new_domain` at `share`, every other domain scaled by (1 - share).

    If the domain is already present its old weight is replaced (the rest are rescaled among
    themselves)."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    rest = {k: w for k, w in weights.items() if k != new_domain}
    out = {k: w * (1 - share) for k, w in normalise(rest).items()}
    out[new_domain] = share
    return out


def largest_remainder(shares: Mapping[str, float], n: int) -> dict[str, int]:
    """Integer counts summing to n, proportional to shares (Hamilton's method, ties by name)."""
    raw = {k: s * n for k, s in shares.items()}
    counts = {k: math.floor(v) for k, v in raw.items()}
    left = n - sum(counts.values())
    for k in sorted(raw, key=lambda k: (-(raw[k] - counts[k]), k))[:left]:
        counts[k] += 1
    return counts


def _draw(pool: Sequence[dict], count: int, seed: int, domain: str) -> list[dict]:
    """`count` items: whole seeded permutations of the pool, then part of the next one."""
    out: list[dict] = []
    epoch = 0
    while len(out) < count:
        perm = np.random.default_rng([seed, zlib.crc32(domain.encode()), epoch]).permutation(len(pool))
        out.extend(pool[i] for i in perm[: count - len(out)])
        epoch += 1
    return out


def sample_blend(pools: Mapping[str, Sequence[dict]], weights: Mapping[str, float], seed: int,
                 n: int | None = None, max_epochs: float = 1.0) -> BlendResult:
    """Sample `n` conversations in the proportions of `weights` (see the module docstring).

    n=None: the largest n whose counts stay within max_epochs passes of every pool."""
    shares = {k: s for k, s in normalise(weights).items() if s > 0}
    missing = sorted(k for k in shares if not pools.get(k))
    if missing:
        raise ValueError(f"blend weights name domains with no conversations: {missing}")
    caps = {k: math.floor(max_epochs * len(pools[k])) for k in shares}
    if n is None:
        n = min(math.floor(caps[k] / s) for k, s in shares.items())
    counts = {k: min(c, caps[k]) for k, c in largest_remainder(shares, n).items()}
    convs, domains = [], []
    for k in sorted(counts):
        drawn = _draw(pools[k], counts[k], seed, k)
        convs.extend(drawn)
        domains.extend([k] * len(drawn))
    order = np.random.default_rng([seed, 0x5F7]).permutation(len(convs))
    total = max(len(convs), 1)
    return BlendResult([convs[i] for i in order], [domains[i] for i in order], counts, shares,
                       {k: counts[k] / total for k in counts},
                       {k: counts[k] / len(pools[k]) for k in counts})
