"""The auxiliary terms every objective adds: MoE load balance and multi-token prediction.

Both are per-micro-batch means; weighting them by the micro-batch's `share` of the global
denominator makes the accumulated gradient the global one (objectives/__init__.py). The LM
and SFT objectives differ only in how they compute the MTP head losses (SFT masks targets
across conversation boundaries), so they pass those in as a callable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from stagewise.model.objectives import LossContext


def add_auxiliary(total: torch.Tensor, metrics: dict[str, torch.Tensor], share: float | torch.Tensor,
                  lb_loss_coeff: float, ctx: "LossContext", mtp: Any | None,
                  mtp_losses: Callable[[], list[torch.Tensor]]) -> torch.Tensor:
    """`total` plus the balance loss (when the context has a routing monitor) and the weighted
    MTP losses (when `mtp` is set); records lb_loss and mtp{k}_loss shares in `metrics`."""
    routing = getattr(ctx, "routing", None)
    if routing is not None:
        lb = routing.lb_loss()
        if lb_loss_coeff > 0:
            total = total + (share * lb_loss_coeff) * lb
        metrics["lb_loss"] = (share * lb).detach()
    if mtp is not None:
        losses = mtp_losses()
        total = total + share * mtp.weighted(losses)
        for k, head_loss in enumerate(losses, start=1):
            metrics[f"mtp{k}_loss"] = (share * head_loss).detach()
    return total
