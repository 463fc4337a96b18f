"""AdamW with decoupled weight decay on matrices only.

Decay pulls weights towards zero; on gains (norm weights), biases, the Mamba per-head
scalars (A_log, D, dt_bias) and embedding rows that is harm, not regularisation, so those go
to a group with weight_decay 0 (the Nemotron / Megatron convention). Everything of two or
more dimensions that is not an embedding decays (linear weights, stacked expert weights,
the conv1d kernels, the router).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from stagewise.model.config import OptimizerConfig


def _embedding_param_ids(model: nn.Module) -> set[int]:
    return {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(recurse=False)}


def no_decay(name: str, param: torch.Tensor, embedding_ids: set[int]) -> bool:
    """True for parameters that must not decay: 1-d tensors, biases, norms, embeddings."""
    lowered = name.lower()
    return (
        param.ndim < 2
        or lowered.endswith(".bias")
        or "norm" in lowered
        or id(param) in embedding_ids
    )


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups, decay and no-decay, in the model's parameter order (a stable order keeps
    the optimizer's state dict resumable across processes)."""
    emb = _embedding_param_ids(model)
    decay, keep = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (keep if no_decay(name, p, emb) else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def speed_flags(params: list[torch.Tensor]) -> dict[str, bool]:
    """`fused=True` where this torch has a fused AdamW for the parameters' device and dtype,
    else `foreach=True` (one kernel per op over all tensors instead of one per tensor)."""
    accepted = inspect.signature(torch.optim.AdamW).parameters
    devices = {p.device.type for p in params}
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices  # noqa: PLC0415 (private torch API: its absence is handled below)

        fused_ok = devices <= set(_get_fused_kernels_supported_devices())
    except ImportError:  # older torch: fused on CUDA only
        fused_ok = devices == {"cuda"}
    fused_ok = fused_ok and all(p.is_floating_point() for p in params)
    if "fused" in accepted and fused_ok:
        return {"fused": True}
    if "foreach" in accepted:
        return {"foreach": True}
    return {}


def build_optimizer(model: nn.Module, opt: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters with the config's betas, eps and decay.
    The learning rate is set by the engine before every step (schedules.lr_at)."""
    groups = param_groups(model, opt.weight_decay)
    params = [p for g in groups for p in g["params"]]
    return torch.optim.AdamW(groups, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, **speed_flags(params))
