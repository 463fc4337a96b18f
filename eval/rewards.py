"""Rewards of one GRPO group: accuracy, format, and a length term, weighted into a total.

For the G completions sampled for one prompt (row), `group_rewards` returns per completion

    accuracy  env.verify: 1.0 right, 0.0 wrong; None (the row cannot be judged) counts as 0.0
              and is flagged in "unjudged" (1.0), so a caller can log how often it happens
    format    1.0 when env.well_formed (the answer is in the required place and shape), else 0.0
    length    the group-relative length term below
    total     cfg.accuracy * accuracy + cfg.format * format + cfg.length * length

Length term (ours; docs/ALGORITHMS.md section 5). Let C be the correct completions of the
group (accuracy 1.0) with token lengths ℓᵢ, ℓ̄ their mean and Δ = max_C ℓ − min_C ℓ. Then

    lengthᵢ = (ℓ̄ − ℓᵢ) / Δ   for i in C,   0 for every wrong completion,
    and 0 for all when |C| < 2 or Δ = 0.

It sums to zero over C, so its group mean is exactly zero: it moves no reward between right
and wrong answers, it only ranks the right ones, shorter first. |lengthᵢ| < 1, so with cfg.length < cfg.accuracy a right answer always
out-scores a wrong one. Example: lengths [10, 20, 30, 5], the first three right: ℓ̄ = 20,
Δ = 20, length = [0.5, 0.0, -0.5, 0.0].
"""

from __future__ import annotations

from pydantic import Field

from stagewise.config_base import StrictConfig
from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments import Environment

KEYS = ("accuracy", "format", "length", "total", "unjudged")


class RewardConfig(StrictConfig):
    """Weights of the reward components (a recipe's `reward:` block)."""


    accuracy: float = Field(1.0, ge=0)
    """Weight of the verifier's reward (1 right, 0 wrong)."""
    format: float = Field(0.0, ge=0)
    """Weight of well_formed (0/1): the answer's shape, right or wrong."""
    length: float = Field(0.0, ge=0)
    """Weight of the group-relative length term (0 = off); keep it below `accuracy`."""


def length_term(correct: list[bool], lengths: list[int]) -> list[float]:
    """(mean − ℓᵢ) / (max − min) over the correct completions, 0 elsewhere (zero group mean)."""
    right = [n for n, ok in zip(lengths, correct) if ok]
    if len(right) < 2 or max(right) == min(right):
        return [0.0] * len(lengths)
    mean, spread = sum(right) / len(right), max(right) - min(right)
    return [(mean - n) / spread if ok else 0.0 for n, ok in zip(lengths, correct)]


def group_rewards(completions: list[str], lengths: list[int], row: RLRow, env: Environment,
                  cfg: RewardConfig) -> dict[str, list[float]]:
    """Per-completion rewards of one group: keys accuracy, format, length, total and unjudged
    (1.0 where verify returned None, which scores as accuracy 0.0)."""
    if len(completions) != len(lengths):
        raise ValueError(f"{len(completions)} completions but {len(lengths)} lengths")
    verdicts = [env.verify(c, row) for c in completions]
    accuracy = [float(v) if v is not None else 0.0 for v in verdicts]
    fmt = [1.0 if env.well_formed(c, row) else 0.0 for c in completions]
    length = length_term([a >= 1.0 for a in accuracy], lengths)
    total = [cfg.accuracy * a + cfg.format * f + cfg.length * n for a, f, n in zip(accuracy, fmt, length)]
    return {"accuracy": accuracy, "format": fmt, "length": length, "total": total,
            "unjudged": [1.0 if v is None else 0.0 for v in verdicts]}


__all__ = ["KEYS", "RewardConfig", "group_rewards", "length_term"]
