"""LoRA adapters on NemotronH (peft), and merging them back into a plain checkpoint.

    model = apply_lora(model, r=16, alpha=32)      # only the adapters train
    ...                                            # train as usual (packed forward works on it)
    plain = merge_lora(model)                      # W + (alpha/r) B A folded in; a NemotronHForCausalLM

Why merge: every later stage, evaluation and export expects a normal HF checkpoint, so
adapters never leave the stage that trained them.

Default targets: attention q/k/v/o_proj, the Mamba in_proj and the dense and shared-expert
MLP up/down_proj. Not the Mamba `out_proj`: with mamba-ssm installed, transformers' fused
training kernel reads `out_proj.weight` directly and would silently skip its adapter.
Routed experts are 3D parameters (NemotronHExperts), which LoRA on Linear layers cannot
reach; they stay frozen.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "up_proj", "down_proj")


def apply_lora(model: torch.nn.Module, r: int = 16, alpha: float = 32.0,
               target_modules: Sequence[str] = DEFAULT_TARGETS, dropout: float = 0.0) -> torch.nn.Module:
    """Wrap `model` in a peft LoRA model (base weights frozen, adapters trainable).

    `target_modules` are module-name suffixes (peft's matching). LoRA B starts at zero, so
    the wrapped model computes exactly what the base model did."""
    from peft import LoraConfig, get_peft_model

    if r <= 0:
        raise ValueError(f"LoRA rank must be > 0, got {r}")
    if "out_proj" in target_modules:
        raise ValueError("target 'out_proj' (Mamba) is not supported: the fused mamba-ssm kernel bypasses its adapter")
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), bias="none")
    return get_peft_model(model, cfg)


def merge_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Fold the adapters into the base weights and return the plain model (no peft layers left)."""
    merge = getattr(model, "merge_and_unload", None)
    if merge is None:
        raise ValueError(f"{type(model).__name__} has no LoRA adapters to merge")
    plain = merge()
    for p in plain.parameters():
        p.requires_grad_(True)
    return plain


def trainable_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), total
