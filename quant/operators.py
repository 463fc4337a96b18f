"""Which operators of a NemotronH model can be quantized, what kind each is, and which must share a format.

The search, the Ultra heuristic, the report and the export's recount all walk the same list, so it
lives here once. An operator is a matmul whose weights a format can hold: every `nn.Linear` and
the fused routed-experts module (`NemotronHExperts`, one 3-D weight per projection). Not
operators: the embeddings (a lookup), Mamba's depthwise conv1d (4 taps: no block of 16 to scale,
and modelopt's export leaves it unquantized), the MoE router (tiny, precision-critical) and norms.

Groups: Q/K/V of one attention layer share a format (deployment fuses them into one GEMM), and the
routed experts of a layer are one operator (one fused module). modelopt's own search groups them
the same way; `group_of` is what our knapsack and the report use.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

import torch

NOT_OPERATORS = ("*.mixer.conv1d", "*.gate", "*.gate.*", "*router*")
"""modelopt patterns kept out of every search and quantization (see the module docstring)."""


@dataclass(frozen=True)
class Operator:
    name: str
    """Module name, as in model.named_modules()."""
    kind: str
    """lm_head, attn_qkv, attn_out, mamba_in, mamba_out, mlp, shared_expert, routed_experts or linear."""
    numel: int
    """Weight elements (all experts together for routed experts)."""


def _kind(name: str, module: torch.nn.Module) -> str:
    leaf = name.rsplit(".", 1)[-1]
    if name == "lm_head":
        return "lm_head"
    if type(module).__name__ == "NemotronHExperts":
        return "routed_experts"
    if ".shared_experts." in name:
        return "shared_expert"
    if leaf in ("q_proj", "k_proj", "v_proj"):
        return "attn_qkv"
    if leaf == "o_proj":
        return "attn_out"
    if leaf == "in_proj":
        return "mamba_in"
    if leaf == "out_proj":
        return "mamba_out"
    if leaf in ("up_proj", "down_proj"):
        return "mlp"
    return "linear"


def _excluded(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in NOT_OPERATORS)


def operators(model: torch.nn.Module) -> list[Operator]:
    """The quantizable operators of `model`, in module order (the routed experts as one each)."""
    out: list[Operator] = []
    for name, module in model.named_modules():
        if not name or _excluded(name) or ".experts." in name:
            continue
        if isinstance(module, torch.nn.Linear):
            out.append(Operator(name, _kind(name, module), module.weight.numel()))
        elif type(module).__name__ == "NemotronHExperts":
            out.append(Operator(name, "routed_experts", sum(p.numel() for p in module.parameters(recurse=False))))
    return out


_QKV = re.compile(r"^(.*)\.(q_proj|k_proj|v_proj)$")


def group_of(name: str) -> str:
    """The format group of an operator: `<attention layer>.qkv` for Q/K/V, else the operator itself."""
    m = _QKV.match(name)
    return f"{m.group(1)}.qkv" if m else name


def matches(name: str, patterns: list[str]) -> bool:
    """Whether a module name matches any fnmatch pattern (`lm_head` also matches a bare `lm_head`)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)
