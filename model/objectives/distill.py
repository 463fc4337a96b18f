"""On-policy distillation (MOPD, ALGORITHMS.md section 7): the per-token advantage of a student sample.

The student samples; one teacher (by the prompt's domain) scores the student's own tokens. On
the sampled token only (no top-k, no full vocabulary):

    d_t = log π_T(y_t) - log π_S(y_t)           (stop-gradient; π_S: the policy that sampled)
    A_t = d_t                                   discount γ = 0 (the published recipe)
    A_t = Σ_{k >= t} γ^(k-t) d_k                 0 < γ <= 1: a token also answers for what follows it

No baseline, no std. The loss is GRPO's (model/objectives/grpo.py) with these per-token
advantages in place of a sample's: L_t = w_t · max(-A_t ρ_t, -A_t clip(ρ_t)), whose gradient at
ρ = 1 is -w_t A_t ∇log π_θ(y_t), the section's L_t = -w_t A_t log π_θ(y_t), with the same
clipping and masked importance sampling as RL (w_t covers the one-step off-policy lag).
Student -2.0 and teacher -0.5 on a token give A = +1.5: the student pushes that token up.

Why the sampling log-probabilities stand for π_S: they are the student's own at the weights
that sampled (the same numbers the IS weight compares with the trainer's), so d_t is the
per-token estimate of the reverse KL the student is being moved down; its mean over response
tokens, log π_S - log π_T, is what `distill/reverse_kl` reports.
"""

from __future__ import annotations

import torch

UNSCORED_BELOW = -1e3
"""A teacher log-prob below this (or not finite) is no score: vLLM answers -9999 for a token its
model gives probability 0 (and NaN marks a token it did not return). Such a token gets
advantage 0 (no signal) instead of an advantage of thousands that would swamp the step."""


def scored(teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """Where the teacher gave a usable log-prob (bool, the shape of its input)."""
    return torch.isfinite(teacher_logprobs) & (teacher_logprobs > UNSCORED_BELOW)


def distill_advantages(teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, mask: torch.Tensor,
                       discount: float = 0.0) -> torch.Tensor:
    """Per-token advantages [n, L-1] (0 outside `mask` and where the teacher gave no score) from
    teacher and student log-probs of the sampled tokens, both [n, L-1]; with `discount` γ > 0 each
    token also gets the discounted sum of the later tokens' d (within its own response: masked
    positions contribute nothing)."""
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    on = (mask > 0) & scored(teacher_logprobs)
    zero = torch.zeros_like(mask, dtype=torch.float32)
    d = torch.where(on, teacher_logprobs.float() - student_logprobs.float(), zero)
    if discount == 0.0:
        return d
    out = torch.zeros_like(d)
    running = torch.zeros(d.shape[0], dtype=d.dtype)
    for t in range(d.shape[1] - 1, -1, -1):  # responses are short: a reverse scan is clear and cheap
        running = d[:, t] + discount * running
        out[:, t] = running
    return torch.where(on, out, torch.zeros_like(out))


def reverse_kl(teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over scored response tokens of log π_S(y) - log π_T(y): the sampled estimate of KL(π_S || π_T)."""
    on = (mask > 0) & scored(teacher_logprobs)
    n = int(on.sum())
    if n == 0:
        return 0.0
    return float((student_logprobs.float() - teacher_logprobs.float())[on].sum() / n)


__all__ = ["UNSCORED_BELOW", "distill_advantages", "reverse_kl", "scored"]
