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

import copy
from collections.abc import Sequence

import torch

from stagewise.model.trainer import Trainer

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "up_proj", "down_proj")


def apply_lora(model: torch.nn.Module, r: int = 16, alpha: float = 32.0,
               target_modules: Sequence[str] = DEFAULT_TARGETS, dropout: float = 0.0,
               seed: int | None = None) -> torch.nn.Module:
    """Wrap `model` in a peft LoRA model (base weights frozen, adapters trainable).

    `target_modules` are module-name suffixes (peft's matching). LoRA B starts at zero, so
    the wrapped model computes exactly what the base model did. With `seed`, the random
    A matrices are drawn from it (same seed, same adapters) without touching the global RNG."""
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415 (peft: 3.5 s to import, only for LoRA stages)

    if r <= 0:
        raise ValueError(f"LoRA rank must be > 0, got {r}")
    if "out_proj" in target_modules:
        raise ValueError("target 'out_proj' (Mamba) is not supported: the fused mamba-ssm kernel bypasses its adapter")
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), bias="none")
    if seed is None:
        return get_peft_model(model, cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
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


# ---------------------------------------------------------------- training with adapters

LORA_STATE = "lora"
"""Key of the adapter weights in a checkpoint's trainer state (monitors.pt)."""


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable adapter tensors by name (what a LoRA checkpoint must keep to resume)."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the adapters folded in; `model` keeps training untouched.

    Costs one extra copy of the weights while a checkpoint is written."""
    return merge_lora(copy.deepcopy(model))


def lora_trainer_class():
    """model.trainer.Trainer for a peft-wrapped model: every checkpoint is the *merged* plain
    model (loadable by AutoModelForCausalLM, evaluable, hand-off-able), and the adapters ride
    in the trainer state, so `resume` continues exactly (the base weights are the stage's
    starting checkpoint, which the wrapped model was built from). It changes only the
    engine's hooks: what a checkpoint's weights are, what extra state it keeps, how resume
    puts the weights back; `Trainer.save` itself is not copied."""
    class LoRATrainer(Trainer):
        def weights_for_checkpoint(self):
            return merged_copy(self.model)

        def state_to_save(self):
            return {LORA_STATE: adapter_state(self.model)}

        def _meta_extra(self):
            return {**super()._meta_extra(), "lora": True}

        def _load_weights(self, ckpt_dir, state):
            if LORA_STATE not in state.monitors:
                raise ValueError(f"{ckpt_dir} holds no LoRA adapter state: it was not saved by a LoRA stage")
            named = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, tensor in state.monitors[LORA_STATE].items():
                    named[name].copy_(tensor)

    return LoRATrainer
