"""Learning-rate schedules over tokens (ALGORITHMS.md section 1).

The schedule is a pure function of the tokens seen, not of the step count, so a change of
batch geometry (or a resume) never shifts it: the engine calls `lr_at` with the tokens seen
at the start of each optimizer step.

    warmup   t < W:            lr = peak * t / W
    constant                   lr = peak
    cosine   W <= t:           r = (t - W) / (T - W), lr = min + (1 + cos(pi r)) / 2 * (peak - min)
    wsd      t < T - D:        lr = peak
             T - D <= t:       r = (t - (T - D)) / D, lr = min + c(r) * (peak - min)
                               c = 1 - sqrt(r) | 1 - r | (1 + cos(pi r)) / 2
After T every decaying schedule stays at min. Warmup wins where it overlaps the decay
(a schedule that asks for that is already odd; we keep the rule simple and visible).
"""

from __future__ import annotations

import math

from stagewise.model.config import OptimizerConfig, ScheduleConfig

_DECAY_SHAPES = {
    "minus_sqrt": lambda r: 1.0 - math.sqrt(r),
    "linear": lambda r: 1.0 - r,
    "cosine": lambda r: 0.5 * (1.0 + math.cos(math.pi * r)),
}


def decay_tokens(sched: ScheduleConfig, total_tokens: int) -> int:
    """Length D of the wsd decay: `decay_tokens` if set, else `decay_fraction` of the total."""
    if sched.decay_tokens is not None:
        return min(sched.decay_tokens, total_tokens)
    return round(sched.decay_fraction * total_tokens)


def lr_at(tokens: int, sched: ScheduleConfig, opt: OptimizerConfig, total_tokens: int) -> float:
    """Learning rate after `tokens` tokens of a stage of `total_tokens` tokens."""
    peak, low = opt.lr, opt.min_lr
    t = max(0, tokens)
    warm = sched.warmup_tokens
    if warm > 0 and t < warm:
        return peak * t / warm
    if sched.kind == "constant":
        return peak
    if sched.kind == "cosine":
        span = total_tokens - warm
        r = 1.0 if span <= 0 else min(1.0, (t - warm) / span)
        return low + _DECAY_SHAPES["cosine"](r) * (peak - low)
    d = decay_tokens(sched, total_tokens)
    start = total_tokens - d
    if t < start:
        return peak
    r = 1.0 if d <= 0 else min(1.0, (t - start) / d)
    return low + _DECAY_SHAPES[sched.decay](r) * (peak - low)
