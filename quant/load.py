"""Load an exported quantized checkpoint for evaluation on any device: our loader, modelopt's fake quant.

transformers cannot load a modelopt export (it skips the quantization and reads FP8 weights as raw
codes, docs/STACK.md), and vLLM needs a GPU. So evaluation reads the export itself: the network is
built from config.json, every weight is decoded by its format (quant/formats/) from what the files
hold (NVFP4: two E2M1 codes a byte x E4M3 block scale x FP32 tensor scale; FP8: E4M3 x FP32 scale;
the rest BF16), fused experts are stacked back, and modelopt's quantizers are inserted with the
plan's formats, their ranges (amax) set from the exported scales (`QuantFormat.amax`) instead of
recalibrated. Re-quantizing a decoded weight with its own scales gives it back exactly, and
activations are quantized as the deployed model quantizes them, so what is scored is what is shipped.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, NemotronHForCausalLM

from stagewise.data.errors import BadInput
from stagewise.model import mamba_torch
from stagewise.model.build import ARCHITECTURES
from stagewise.quant.export import PLAN_FILE, export_name, headers
from stagewise.quant.formats import FORMATS, format_named, format_stored_as
from stagewise.quant.quantizers import plan_config

SCALES = tuple(sorted({s for f in FORMATS.values() for s in f.scales}))
"""Suffixes of every format's scale tensors: read by the formats' decoders, not weights themselves."""


def _weights(tensors: dict[str, torch.Tensor], stored: dict[str, str]) -> dict[str, torch.Tensor]:
    """Decoded float32 weights under the model's own names (`backbone.` -> `model.`), scales dropped.

    `stored` is each tensor's safetensors dtype: a weight stored as a format's dtype is decoded by
    that format (`QuantFormat.stored_as`, `.decode`); any other is taken as it is."""
    out = {}
    for name, t in tensors.items():
        if name.endswith(SCALES):
            continue
        base = name[: -len("weight")] if name.endswith(".weight") else None
        fmt = format_stored_as(stored[name]) if base is not None else None
        if fmt is not None:
            t = fmt.decode(tensors, base)
        out["model." + name[len("backbone."):] if name.startswith("backbone.") else name] = t.float()
    return out


EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def _stack_experts(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert `<m>.experts.<i>.<proj>.weight` back into the fused `<m>.experts.<proj>` [E, out, in]."""
    fused: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
    out = {}
    for name, t in weights.items():
        m = EXPERT.match(name)
        if m:
            fused[f"{m.group(1)}.{m.group(3)}"][int(m.group(2))] = t
        else:
            out[name] = t
    for name, per in fused.items():
        out[name] = torch.stack([per[i] for i in range(len(per))])
    return out


def _set_ranges(model: torch.nn.Module, tensors: dict[str, torch.Tensor], formats: dict[str, str]) -> None:
    """Each quantizer's amax from the export: weight quantizers per tensor (per expert), inputs per projection."""
    from modelopt.torch.quantization.nn import TensorQuantizer  # noqa: PLC0415 (nvidia-modelopt: 7 s to import, only where a model is quantized)

    quantizers = {n: q for n, q in model.named_modules() if isinstance(q, TensorQuantizer) and q.is_enabled}
    for module, name in formats.items():
        fmt = format_named(name)
        if not fmt.quantized:
            continue
        mine = {n: q for n, q in quantizers.items() if n.startswith(module + ".")}
        if any("_weight_quantizers." in n for n in mine):  # fused experts: per projection, per expert
            prefix = export_name(module)
            for proj in ("up_proj", "down_proj"):
                inputs = []
                for e in range(len([n for n in mine if n.startswith(f"{module}.{proj}_weight_quantizers.")])):
                    w, i = fmt.amax(tensors, f"{prefix}.{e}.{proj}.")
                    mine[f"{module}.{proj}_weight_quantizers.{e}"].amax = torch.tensor(w)
                    inputs.append(i)
                mine[f"{module}.{proj}_input_quantizer"].amax = torch.tensor(max(inputs))
        else:
            w, i = fmt.amax(tensors, export_name(module) + ".")
            mine[f"{module}.weight_quantizer"].amax = torch.tensor(w)
            mine[f"{module}.input_quantizer"].amax = torch.tensor(i)


def read_plan(export_dir: str | Path) -> dict:
    """The plan saved beside an export (every operator's format, the searched set, the method)."""
    path = Path(export_dir) / PLAN_FILE
    if not path.exists():
        raise BadInput(f"{export_dir}: not a stagewise quantized export (no {PLAN_FILE})")
    return json.loads(path.read_text(encoding="utf-8"))


def load_quantized(export_dir: str | Path, device: str = "cpu") -> torch.nn.Module:
    """The exported model with fake-quantized weights and activations, ready to score on `device`."""
    import modelopt.torch.quantization as mtq  # noqa: PLC0415 (nvidia-modelopt: 7 s to import, only where a model is quantized)


    mamba_torch.install()  # the same Mamba-2 functions as the model it was quantized from

    export_dir = Path(export_dir)
    formats = read_plan(export_dir)["formats"]
    config = AutoConfig.from_pretrained(str(export_dir))
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(export_dir.glob("*.safetensors")):
        tensors |= load_file(str(f))
    model = NemotronHForCausalLM(config)
    model.config.architectures = list(ARCHITECTURES)
    state = _stack_experts(_weights(tensors, {k: dtype for k, (dtype, _) in headers(export_dir).items()}))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight") or not config.tie_word_embeddings]:
        raise BadInput(f"{export_dir}: the weights do not fit its config.json (missing {missing[:5]}, "
                       f"unexpected {unexpected[:5]})")
    model = model.float().to(device).eval()
    model = mtq.quantize(model, plan_config(formats, device), forward_loop=None)
    _set_ranges(model, tensors, formats)
    # The decoded weights are already on their grid (re-quantizing gives them back): fold them once
    # instead of fake-quantizing every weight on every forward (generation runs hundreds of them).
    mtq.fold_weight(model)
    return model
