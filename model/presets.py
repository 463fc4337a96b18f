"""Named NemotronH shapes: the `preset:` a recipe picks.

Three hand-made shapes for CPU work (`tiny` for the demo and tests, `tiny-dense` the same without
MoE layers for vLLM's CPU build, `small` for a longer local run) and the published shapes, read from `model/presets/<name>.json` (file stem =
preset name). Each JSON holds the NemotronHConfig kwargs under `config` and, under
`_about`, where the shape comes from and its exact parameter count (the tests check it).

A preset is plain NemotronHConfig kwargs. `vocab_size: None` means "take the tokenizer's
vocabulary" (build.py fills it in). Every preset sets `max_position_embeddings` and
`n_routed_experts` explicitly: a preset that leaves them out gets NemotronHConfig's defaults
(4096 and 8) without any error (docs/STACK.md, transformers).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

PRESET_DIR = Path(__file__).parent / "presets"

# ~2M parameters at a 4k vocabulary: every layer type once or twice, so the demo and the
# tests exercise Mamba-2, attention, MLP and MoE (8 routed experts, top-2, one shared).
_TINY: dict[str, Any] = {
    "vocab_size": None,
    "hidden_size": 128,
    "hybrid_override_pattern": "M*EM-E",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 512,
    "mlp_hidden_act": "relu2",
    "ssm_state_size": 32,
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "n_groups": 2,
    "conv_kernel": 4,
    "expand": 2,
    # The SSD scan's block length (the math does not depend on it). Our PyTorch scan
    # (model/mamba_torch.py) on 2 CPU cores, forward + backward: RL and distillation's ~72-token
    # rollouts 47 ms at 32 against 85 ms at 64 (less padding), 256-2048 tokens about even.
    "chunk_size": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "moe_shared_expert_intermediate_size": 256,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
    "n_group": 1,
    "topk_group": 1,
    "tie_word_embeddings": False,
    # No RoPE in NemotronH: this is only the advertised context (generation, lm-eval).
    "max_position_embeddings": 16384,
    "use_conv_bias": True,
    "mamba_proj_bias": False,
    "use_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
}

# ~34M parameters (~17M active) at a 4k vocabulary, Nano-like layout (Mamba/MoE alternating, a few
# attention layers, 16 routed experts top-2).
_SMALL: dict[str, Any] = {
    **_TINY,
    "hidden_size": 384,
    "hybrid_override_pattern": "MEM*EMEM-MEM*EME",
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 1536,
    "ssm_state_size": 64,
    "mamba_num_heads": 12,
    "mamba_head_dim": 64,
    "n_groups": 4,
    "chunk_size": 128,
    "n_routed_experts": 16,
    "moe_intermediate_size": 256,
    "moe_shared_expert_intermediate_size": 512,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 2.0,
    "max_position_embeddings": 32768,
}

# `tiny` without its MoE layers (each E an MLP): what vLLM's CPU build serves (its fused-MoE kernel refuses
# NemotronH's non-gated relu2 experts off CUDA, docs/STACK.md), so the tests of the real vLLM paths and a
# CPU recipe with `backend: vllm` use it.
_TINY_DENSE: dict[str, Any] = {**_TINY, "hybrid_override_pattern": "M*-M--"}

_BUILTIN = {"tiny": _TINY, "tiny-dense": _TINY_DENSE, "small": _SMALL}


@cache
def _published() -> dict[str, dict[str, Any]]:
    """{name: {"config": ..., "_about": ...}} for every JSON under model/presets/."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(PRESET_DIR.glob("*.json"))}


def preset_names() -> list[str]:
    """All preset names: the built-in ones first, then the published shapes (sorted)."""
    return [*_BUILTIN, *_published()]


def preset_kwargs(name: str) -> dict[str, Any]:
    """A fresh copy of the NemotronHConfig kwargs of preset `name` (ValueError if unknown)."""
    if name in _BUILTIN:
        return copy.deepcopy(_BUILTIN[name])
    if name in _published():
        return copy.deepcopy(_published()[name]["config"])
    raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(preset_names())}")


def preset_about(name: str) -> dict[str, Any]:
    """The `_about` block of a published preset (source, exact total_params); {} for built-ins."""
    preset_kwargs(name)  # validates the name
    return copy.deepcopy(_published().get(name, {}).get("_about", {}))
