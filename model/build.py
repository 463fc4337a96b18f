"""Turn a `ModelConfig` into a NemotronH causal LM, or load one back from a checkpoint.

The chain is preset kwargs -> overrides (checked against NemotronHConfig's fields, so a typo
fails with the nearest valid name instead of becoming a silent extra attribute) -> vocabulary
(from the tokenizer when the preset leaves it open) -> NemotronHConfig -> seeded model
(+ optional MTP heads). Everything is plain torch/transformers: usable from a notebook.
Both entry points install our Mamba-2 PyTorch functions in transformers (model/mamba_torch.py).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, NemotronHConfig, NemotronHForCausalLM

from stagewise.model import mamba_torch
from stagewise.model.checkpoint_check import check_checkpoint
from stagewise.model.config import ModelConfig
from stagewise.model.mtp import MTPHeads, attach_mtp, mtp_state_dict, read_mtp_settings
from stagewise.model.presets import preset_kwargs

ARCHITECTURES = ["NemotronHForCausalLM"]
# Accepted besides the dataclass fields: the pattern strings NemotronHConfig converts itself.
_EXTRA_KEYS = {"hybrid_override_pattern", "mtp_hybrid_override_pattern", *NemotronHConfig.attribute_map}
# The MTP head count belongs to `model.mtp`, not to free-form overrides.
_FORBIDDEN = {"num_nextn_predict_layers": "set model.mtp.num_heads instead"}


def valid_override_keys() -> set[str]:
    """Names an override may set: NemotronHConfig's fields plus the pattern shorthands."""
    return {f.name for f in dataclasses.fields(NemotronHConfig)} | _EXTRA_KEYS


def check_overrides(overrides: dict[str, Any]) -> None:
    """ValueError naming the first unknown key and its nearest valid NemotronHConfig field."""
    valid = valid_override_keys()
    for key in overrides:
        if key in _FORBIDDEN:
            raise ValueError(f"model.overrides.{key}: not allowed here, {_FORBIDDEN[key]}")
        if key not in valid:
            near = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.0)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(f"model.overrides.{key}: NemotronHConfig has no field {key!r}{hint}")


def _resolve_vocab(preset_vocab: int | None, tokenizer_vocab: int | None, source: str) -> int:
    if preset_vocab is None:
        if tokenizer_vocab is None:
            raise ValueError(f"{source} takes its vocab_size from the tokenizer, but no vocab_size was given")
        return int(tokenizer_vocab)
    if tokenizer_vocab is not None and tokenizer_vocab > preset_vocab:
        raise ValueError(
            f"{source} has vocab_size {preset_vocab} but the tokenizer has {tokenizer_vocab} tokens; "
            "use a smaller tokenizer or override model.overrides.vocab_size"
        )
    return int(preset_vocab)


def build_hf_config(cfg: ModelConfig, vocab_size: int | None) -> NemotronHConfig:
    """NemotronHConfig for `cfg`: the checkpoint's config for `from`, else preset + overrides."""
    if cfg.from_ is not None:
        check_checkpoint(cfg.from_, weights=False)  # a missing or broken config.json is bad input (exit 2)
        config = AutoConfig.from_pretrained(cfg.from_)
        if not isinstance(config, NemotronHConfig):
            raise ValueError(f"model.from: {cfg.from_} holds a {type(config).__name__}, not a NemotronH config")
        _resolve_vocab(config.vocab_size, vocab_size, f"checkpoint {cfg.from_}")
    else:
        if cfg.preset is None:
            raise ValueError("model: give a `preset` or `from` (a checkpoint directory)")
        kwargs = preset_kwargs(cfg.preset)
        check_overrides(cfg.overrides)
        if "layers_block_type" in cfg.overrides:  # the explicit list wins over the preset's pattern
            kwargs.pop("hybrid_override_pattern", None)
        kwargs.update(cfg.overrides)
        kwargs["vocab_size"] = _resolve_vocab(kwargs.get("vocab_size"), vocab_size, f"preset {cfg.preset!r}")
        try:
            config = NemotronHConfig(**kwargs)
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"model: preset {cfg.preset!r} with overrides is not a valid NemotronHConfig: {err}") from err
    config.num_nextn_predict_layers = cfg.mtp.num_heads
    if cfg.mtp.num_heads:
        config.mtp_layers_block_type = ["mlp"]  # what MTPHeads' block is (model/mtp.py)
    config.architectures = list(ARCHITECTURES)
    return config


def build_model(cfg: ModelConfig, vocab_size: int | None, seed: int, device: str | torch.device = "cpu") -> NemotronHForCausalLM:
    """A fresh model initialised from `seed` (same seed, same weights), or the `from` checkpoint.

    With `from`, the checkpoint's weights are loaded; its MTP heads are kept when
    cfg.mtp.num_heads matches them, replaced by fresh seeded ones when it differs, and
    dropped when cfg.mtp.num_heads is 0 (the recipe decides). Its Mamba layers run our PyTorch
    functions where no kernel is installed (model/mamba_torch.py).
    """
    mamba_torch.install()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if cfg.from_ is not None:
            check_checkpoint(cfg.from_)  # truncated or mismatched weights are bad input, not a traceback
            model = load_model(cfg.from_)
            _resolve_vocab(model.config.vocab_size, vocab_size, f"checkpoint {cfg.from_}")
            have = model.mtp.num_heads if isinstance(getattr(model, "mtp", None), MTPHeads) else 0
            if have != cfg.mtp.num_heads:
                attach_mtp(model, cfg.mtp.num_heads, cfg.mtp.loss_weight)
            elif have:
                model.mtp.loss_weight = cfg.mtp.loss_weight
        else:
            model = NemotronHForCausalLM(build_hf_config(cfg, vocab_size))
            if cfg.mtp.num_heads:
                attach_mtp(model, cfg.mtp.num_heads, cfg.mtp.loss_weight)
    return model.to(device)


def load_model(
    ckpt_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> NemotronHForCausalLM:
    """Load an HF-format checkpoint and re-attach its MTP heads (settings: model/mtp.py); its Mamba
    layers run our PyTorch functions where no kernel is installed (model/mamba_torch.py)."""
    mamba_torch.install()
    model = AutoModelForCausalLM.from_pretrained(str(ckpt_dir), dtype=dtype)
    model.config.architectures = list(ARCHITECTURES)
    settings = read_mtp_settings(ckpt_dir)
    if settings.num_heads:
        attach_mtp(model, settings.num_heads, settings.loss_weight)
        state = mtp_state_dict(ckpt_dir)
        if not state:
            raise ValueError(f"{ckpt_dir}: MTP is on ({settings.num_heads} heads) but the weights hold no mtp.* tensors")
        model.mtp.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    return model.to(device)
