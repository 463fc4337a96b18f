"""Training objectives: what loss one optimizer step minimises.

An objective turns a micro-batch into a loss tensor ready for `.backward()`. The engine
owns everything else (micro-batching, precision, clipping, the optimizer), so a new stage
(SFT, distillation) brings a new objective and reuses the loop.

The interface is two calls per optimizer step:

    denom = objective.denominator(micro_batches)           # once, before any backward
    for micro in micro_batches:
        loss, metrics = objective.loss(model, micro, denom, ctx)
        loss.backward()

Why a denominator first: a loss normalised over the *whole global batch* (SFT's
token-level loss: sum of masked token losses / number of supervised tokens in the global
batch, ALGORITHMS.md section 4) cannot be computed per micro-batch as a mean and then
averaged, because micro-batches hold different numbers of supervised tokens. With the
global normaliser known up front, each micro-batch returns `its summed loss / denom`, the
gradients accumulate to exactly the gradient of the global loss, and gradient accumulation
(or data parallelism, once the denominator is all-reduced) changes nothing. The
denominator may be a Python number or a tensor (a tensor avoids a host sync).

`metrics` are detached tensors, each this micro-batch's *additive share* of the step's
value (the engine sums them over micro-batches with no host sync and logs them under
`train/<name>`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from stagewise.model.objectives.grpo import GRPOObjective
from stagewise.model.objectives.lm import LMObjective


@dataclass
class LossContext:
    """What the engine hands an objective besides the batch; grows without breaking callers."""

    routing: Any | None = None
    """The RoutingMonitor (lb_loss() of the micro-batch just run), or None without MoE."""


class Objective(Protocol):
    """Anything with these two methods can be trained by model.trainer.Trainer."""

    def denominator(self, micro_batches: Sequence[torch.Tensor]) -> float | torch.Tensor:
        """The normaliser of the whole global batch, computed before any backward pass."""
        ...

    def loss(
        self, model: torch.nn.Module, micro: torch.Tensor, denom: float | torch.Tensor, ctx: LossContext
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This micro-batch's share of the global loss, and its additive metric shares."""
        ...


__all__ = ["GRPOObjective", "LMObjective", "LossContext", "Objective"]
