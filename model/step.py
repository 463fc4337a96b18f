"""The compute of one optimizer step, kept lean: the engine's speed is decided here.

Why it looks the way it does: every `.item()` / `.tolist()` is a host-device sync that
stalls a GPU, and every per-parameter Python loop launches one kernel per tensor. So the
micro-batch loop keeps its metrics as device tensors (summed, never read), the gradient
statistics use the multi-tensor `_foreach_norm` kernels (one launch per dtype group) and
keep their results on the device, and
`collect` reads everything the step reports back in one `.tolist()`, before the
optimizer update, so that a NaN can be refused while the weights are still good.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Sequence

import torch

from stagewise.model.objectives import LossContext


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 for "bf16", and for "auto" on a CUDA device with bf16
    support; None (plain fp32) otherwise. CPU autocast is slower than fp32 for small models,
    so "auto" never picks it."""
    if precision == "bf16":
        return torch.bfloat16
    if precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def autocast(device: torch.device, dtype: torch.dtype | None):
    """An autocast context for `dtype`, or a no-op context for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _norms(tensors: Sequence[torch.Tensor], ord: float) -> torch.Tensor:
    """Per-tensor norms as one fp32 vector: one `_foreach_norm` per dtype group."""
    groups: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        groups[t.dtype].append(t)
    parts = [torch.stack(torch._foreach_norm(g, ord)).float() for g in groups.values()]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def grad_stats(params: Sequence[torch.Tensor], total_numel: int) -> dict[str, torch.Tensor]:
    """grad_norm (global L2, before clipping), num_zeros (gradient elements exactly 0, a
    missing gradient counting as all zeros) and params_norm (global L2 of the weights)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        zero = torch.zeros((), device=params[0].device)
        return {"grad_norm": zero, "num_zeros": zero + total_numel, "params_norm": _norms(params, 2).norm()}
    # count_nonzero per tensor: measured 30% faster than _foreach_norm(ord=0) on the CPU, and
    # ord 0 has no fused CUDA kernel either; the counts stay on the device (no sync).
    nonzero = torch.stack([torch.count_nonzero(g) for g in grads]).sum()
    return {
        "grad_norm": _norms(grads, 2).norm(),
        "num_zeros": total_numel - nonzero,
        "params_norm": _norms(params, 2).norm(),
    }


def accumulate(
    model: torch.nn.Module,
    objective: Any,
    micros: Sequence[torch.Tensor],
    ctx: LossContext,
    amp_dtype: torch.dtype | None,
) -> dict[str, torch.Tensor]:
    """Forward and backward every micro-batch; the summed loss (`loss`) and metric shares."""
    device = micros[0].device
    denom = objective.denominator(micros)
    routing = ctx.routing
    sums: dict[str, torch.Tensor] = {}
    for micro in micros:
        with autocast(device, amp_dtype):
            loss, metrics = objective.loss(model, micro, denom, ctx)
        loss.backward()
        if routing is not None:
            routing.clear()  # frees this micro-batch's router graph; keeps the step's counts
        metrics = {"loss": loss.detach(), **metrics}
        for name, value in metrics.items():
            sums[name] = value if name not in sums else sums[name] + value
    return sums


def collect(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """Read every scalar tensor back to the host in one sync."""
    names = list(values)
    device_values = torch.stack([values[n].detach().float().reshape(()) for n in names])
    return dict(zip(names, device_values.cpu().tolist()))
