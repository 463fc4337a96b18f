"""Next-token language modelling (pretraining and long-context stages).

On a [B, T+1] token batch (inputs = [:, :-1], labels = [:, 1:]) the step minimises

    L = mean token cross-entropy
        + lb_loss_coeff * RoutingMonitor.lb_loss()        (MoE load balance, ALGORITHMS.md 9)
        + mtp.loss_weight * mean over heads of MTP loss   (when the model has `model.mtp`)

The trunk runs once (`model.model`), `lm_head` turns its hidden states into logits, and the
MTP heads reuse the same hidden states: a separate `model(...)` call for each would run the
trunk twice. The auxiliary terms are per-micro-batch means, weighted by the micro-batch's
share of the global batch's tokens so that the accumulated gradient is the global mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F

from stagewise.model.objectives.auxiliary import add_auxiliary
from stagewise.model.objectives.fused_ce import fusable, output_layer_cross_entropy

if TYPE_CHECKING:
    from stagewise.model.objectives import LossContext


class LMObjective:
    """Next-token cross-entropy with the MoE balance and MTP terms; see the module docstring."""

    def __init__(self, lb_loss_coeff: float = 1e-3) -> None:
        self.lb_loss_coeff = float(lb_loss_coeff)

    def denominator(self, micro_batches: Sequence[torch.Tensor]) -> float:
        """Predicted tokens in the global batch (every position has a label in pretraining)."""
        return float(sum(m.shape[0] * (m.shape[1] - 1) for m in micro_batches))

    def loss(
        self, model: torch.nn.Module, micro: torch.Tensor, denom: float | torch.Tensor, ctx: "LossContext"
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This micro-batch's share of the global loss and of each metric.

        Metrics (shares that sum to the global-batch value): lm_loss (mean token CE),
        lb_loss (the balance loss without its coefficient: 1.0 under uniform routing),
        mtp{k}_loss (head k's mean CE, k = 1..K).
        """
        inputs, labels = micro[:, :-1], micro[:, 1:]
        hidden = model.model(input_ids=inputs, use_cache=False).last_hidden_state
        if fusable(model.lm_head):  # the output layer and the loss chunk by chunk (objectives/fused_ce.py)
            ce_sum = output_layer_cross_entropy(hidden.flatten(0, 1), model.lm_head.weight, labels.reshape(-1))
        else:
            logits = model.lm_head(hidden).float()
            ce_sum = F.cross_entropy(logits.flatten(0, 1), labels.reshape(-1), reduction="sum")
        share = labels.numel() / denom
        total = ce_sum / denom
        metrics = {"lm_loss": total.detach()}
        mtp = getattr(model, "mtp", None)
        total = add_auxiliary(total, metrics, share, self.lb_loss_coeff, ctx, mtp,
                              lambda: mtp.losses(hidden, inputs, labels, model))
        return total, metrics
