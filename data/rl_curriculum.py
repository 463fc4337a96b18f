"""Which RL prompts a GRPO step trains on: the difficulty filter and the Gaussian curriculum.

ALGORITHMS.md section 6. Every prompt is profiled K times with the starting policy, giving a
pass rate p = k/K. A prompt the policy always solves (p = 1) yields groups whose rewards are
all equal, hence zero advantage and no gradient, so `difficulty_filter` drops it; p = 0
prompts are kept (and counted) unless asked otherwise, because a later policy may solve them.

The curriculum moves the batch from easy to hard: at step s of S the target pass rate is
mu(s) = mu_start + (mu_end - mu_start) * s / (S - 1) (mu_start = 0.875, mu_end = 0.125). The
pass-rate axis is cut into `bins` equal bins; bin b covers [b/bins, (b+1)/bins) (p = 1 falls
in the last bin) and is represented by its lower edge p_b = b/bins. `sample_batch` builds one
batch of B prompt ids:

1. domain d gets n_d = B * r_d prompts (ratios normalised), rounded by largest remainder
   (`largest_remainder`): the same counts at every step;
2. within d, bin b gets the share phi((p_b - mu)/sigma) / sum_b' phi(...) of n_d, rounded by
   largest remainder, then capped by the prompts the bin holds; the shortfall goes one prompt
   at a time to the bin with the most prompts still unpicked ("the fullest"; ties: the larger
   share, then the lower bin);
3. prompts are drawn without replacement within each bin, and the batch is shuffled.

A domain holding fewer prompts than n_d contributes every prompt floor(n_d / size) times and
the remainder by the rule above, so the batch always has B ids. Everything random goes
through the given `random.Random`, so a batch is a function of (inputs, rng state).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from pydantic import Field

from stagewise.config_base import StrictConfig

FILTER_COUNTS = ("kept", "dropped_solved", "dropped_unsolved", "unsolved_kept")


class CurriculumConfig(StrictConfig):
    """The Gaussian curriculum (defaults: ALGORITHMS.md section 6)."""


    mu_start: float = Field(0.875, ge=0, le=1, description="target pass rate at the first step")
    mu_end: float = Field(0.125, ge=0, le=1, description="target pass rate at the last step")
    sigma: float = Field(0.15, gt=0, description="width of the Gaussian over pass rates")
    bins: int = Field(8, ge=1, description="equal pass-rate bins over [0, 1]")


def difficulty_filter(pass_rates: Mapping[str, float], drop_solved: bool = True,
                      drop_unsolved: bool = False) -> tuple[list[str], dict[str, int]]:
    """The ids to train on (input order) and counts {"kept", "dropped_solved",
    "dropped_unsolved", "unsolved_kept"}. p = 1 is dropped when drop_solved, p = 0 when
    drop_unsolved (else kept and counted in unsolved_kept). ValueError names an id whose pass
    rate is not in [0, 1]."""
    kept: list[str] = []
    counts = dict.fromkeys(FILTER_COUNTS, 0)
    for pid, p in pass_rates.items():
        _check_rate(pid, p)
        if p >= 1.0 and drop_solved:
            counts["dropped_solved"] += 1
            continue
        if p <= 0.0:
            if drop_unsolved:
                counts["dropped_unsolved"] += 1
                continue
            counts["unsolved_kept"] += 1
        kept.append(pid)
    counts["kept"] = len(kept)
    return kept, counts


def curriculum_mu(step: int, total_steps: int, cfg: CurriculumConfig) -> float:
    """mu(s) = mu_start + (mu_end - mu_start) * s / (S - 1), s clamped to [0, S - 1]; mu_start when S = 1."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if total_steps == 1:
        return cfg.mu_start
    s = min(max(step, 0), total_steps - 1)
    return cfg.mu_start + (cfg.mu_end - cfg.mu_start) * s / (total_steps - 1)


def bin_shares(mu: float, sigma: float, bins: int) -> list[float]:
    """Share of bin b proportional to phi((b/bins - mu)/sigma), normalised to sum 1 (computed
    as a softmax of -z^2/2, so a far-away mu never divides by zero)."""
    if sigma <= 0 or bins < 1:
        raise ValueError(f"need sigma > 0 and bins >= 1, got sigma={sigma}, bins={bins}")
    logs = [-0.5 * ((b / bins - mu) / sigma) ** 2 for b in range(bins)]
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    total = sum(weights)
    return [w / total for w in weights]


def pass_rate_bin(p: float, bins: int) -> int:
    """The bin of pass rate p: floor(p * bins), with p = 1 in the last bin (a 1e-9 guard keeps
    k/K values that land on a bin edge from rounding into the bin below)."""
    return min(int(math.floor(p * bins + 1e-9)), bins - 1)


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """Integers summing to `total`, proportional to `weights`: floors of total * w / sum(w), the
    rest one each to the largest fractional parts (ties: the lower index)."""
    norm = sum(weights)
    if total < 0 or norm <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"need total >= 0 and non-negative weights with a positive sum, got {total}, {list(weights)}")
    ideal = [total * w / norm for w in weights]
    counts = [math.floor(x) for x in ideal]
    order = sorted(range(len(weights)), key=lambda i: (-(ideal[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def bin_counts(n: int, shares: Sequence[float], holds: Sequence[int]) -> list[int]:
    """How many prompts each bin gives: largest-remainder counts of `shares`, capped by `holds`,
    the shortfall one at a time to the bin nearest the curriculum's mean that still has prompts
    left, i.e. the largest share (ties: the most prompts left, then lower bin). Needs n <= sum(holds).

    Why nearest and not fullest: early in a stage μ sits where few prompts are (a fine-tuned
    model solves few prompts 7/8 of the time), and the fullest bin is usually the 0/k one,
    whose groups carry no reward variance; on the demo the fullest-bin rule filled most of each
    early batch from it and learned less than uniform sampling (+0.05 against +0.09 held-out
    arithmetic pass@1 in 60 steps). The nearest rule keeps the batch as close to μ as the data allows."""
    if n > sum(holds):
        raise ValueError(f"cannot pick {n} prompts from bins holding {sum(holds)}")
    counts = [min(c, h) for c, h in zip(largest_remainder(n, shares), holds)]
    for _ in range(n - sum(counts)):
        b = max((i for i in range(len(holds)) if holds[i] > counts[i]),
                key=lambda i: (shares[i], holds[i] - counts[i], -i))
        counts[b] += 1
    return counts


def sample_batch(prompts: Mapping[str, Sequence[tuple[str, float]]], domain_ratios: Mapping[str, float],
                 batch_size: int, step: int, total_steps: int, cfg: CurriculumConfig,
                 rng: random.Random) -> list[str]:
    """One batch of `batch_size` prompt ids (shuffled): per-domain counts by largest remainder of
    `domain_ratios`, bins by the Gaussian share at curriculum_mu(step); see the module docstring.
    `prompts` maps a domain to its (prompt id, pass rate) pairs. ValueError names a domain with
    a positive ratio and no prompts, a negative ratio, or a pass rate outside [0, 1]."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for d, r in domain_ratios.items():
        if r < 0:
            raise ValueError(f"domain_ratios[{d!r}] must be >= 0, got {r}")
    if sum(domain_ratios.values()) <= 0:
        raise ValueError("domain_ratios: at least one ratio must be positive")
    shares = bin_shares(curriculum_mu(step, total_steps, cfg), cfg.sigma, cfg.bins)
    batch: list[str] = []
    for domain, n in zip(domain_ratios, largest_remainder(batch_size, list(domain_ratios.values()))):
        if n == 0:
            continue
        pool = list(prompts.get(domain, ()))
        if not pool:
            raise ValueError(f"domain {domain!r} has ratio {domain_ratios[domain]} but no prompts")
        by_bin: list[list[str]] = [[] for _ in range(cfg.bins)]
        for pid, p in pool:
            _check_rate(f"{domain}/{pid}", p)
            by_bin[pass_rate_bin(p, cfg.bins)].append(pid)
        rounds, rest = divmod(n, len(pool))
        batch.extend(pid for _ in range(rounds) for pid, _ in pool)
        for ids, k in zip(by_bin, bin_counts(rest, shares, [len(b) for b in by_bin])):
            batch.extend(rng.sample(ids, k))
    rng.shuffle(batch)
    return batch


def _check_rate(pid: str, p: float) -> None:
    if not (isinstance(p, (int, float)) and 0.0 <= p <= 1.0):
        raise ValueError(f"pass rate of {pid!r} must be in [0, 1], got {p!r}")
