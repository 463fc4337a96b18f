"""Forward FLOPs per token of the quantizable operators of a NemotronH model, and their cost.

The format search (docs/ALGORITHMS.md §8, the Super report's variant) charges each operator
its FLOPs at the chosen precision, so the knapsack's budget is "tensor-core time": an operator
that does more work per token costs more, and a narrower format makes the same work cheaper.
Counting is per token because that is what serving pays: a Linear does one multiply-add per
weight, and a routed-experts module only runs the experts its router picked.
"""

from __future__ import annotations

from torch import nn
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHExperts

from stagewise.quant.formats import format_named


def _experts_class() -> type:
    return NemotronHExperts


def linear_flops(module: nn.Linear) -> float:
    """2 * in * out: one multiply and one add per weight for each token."""
    return 2.0 * module.in_features * module.out_features


def experts_flops(module: nn.Module, top_k: int, n_experts: int) -> float:
    """Fused routed experts (up_proj, down_proj [n_experts, out, in]): all expert weights' FLOPs
    scaled by the share of experts a token is routed to (top_k of n_experts)."""
    weights = module.up_proj.numel() + module.down_proj.numel()
    return 2.0 * weights * (top_k / n_experts)


def operator_flops(model: nn.Module, names: list[str]) -> dict[str, float]:
    """Forward FLOPs per token of each named module (names as in `model.named_modules()`).

    A Linear (lm_head included) or a NemotronHExperts module is counted; any other name or kind
    raises ValueError naming it."""
    modules = dict(model.named_modules())
    experts = _experts_class()
    out = {}
    for name in names:
        module = modules.get(name)
        if module is None:
            raise ValueError(f"{name!r}: no such module in the model")
        if isinstance(module, nn.Linear):
            out[name] = linear_flops(module)
        elif isinstance(module, experts):
            cfg = model.config
            out[name] = experts_flops(module, cfg.num_experts_per_tok, cfg.n_routed_experts)
        else:
            kind = type(module).__name__
            raise ValueError(f"{name!r}: a {kind}, not a quantizable operator (Linear or NemotronHExperts)")
    return out


def format_cost(flops: float, fmt: str) -> float:
    """`flops` in BF16-equivalent tensor-core time when run in `fmt`: the format's time per FLOP
    relative to BF16 (`QuantFormat.flop_cost`, e.g. Blackwell's FP8 at 2x and NVFP4 at 4x BF16's
    throughput take 1/2 and 1/4 of the time). ValueError for a name not in the registry."""
    return flops * format_named(fmt).flop_cost
