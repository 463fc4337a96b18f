"""Our formats as modelopt quantizer settings, and a per-operator plan as one modelopt config.

Every path that quantizes a model (the search's result, the Ultra heuristic, the reload of an
export) goes through `plan_config`, so a format means the same quantizers everywhere: weights and
the operator's input activations both in the format (W4A4 NVFP4, W8A8 FP8), per-tensor FP8 scales,
NVFP4 blocks of 16 along the reduction dimension with E4M3 block scales. Which modelopt preset a
format takes is the format's own (`QuantFormat.modelopt_preset`, quant/formats/). On a CPU, NVFP4
entries use our PyTorch fake quantization (quant/nvfp4_emulation.py: modelopt's dynamic NVFP4 needs CUDA);
on a GPU modelopt's own kernels.
"""

from __future__ import annotations

import copy
from typing import Any

from stagewise.quant.formats import format_named
from stagewise.quant.nvfp4_emulation import with_cpu_backend


def _preset(fmt: str, device: str) -> dict[str, Any]:
    """modelopt's preset config for `fmt`; on a CPU, NVFP4 through our emulation (quant/nvfp4_emulation.py)."""
    import modelopt.torch.quantization as mtq  # noqa: PLC0415 (nvidia-modelopt: 7-12 s to import, only where a model is quantized)

    spec = format_named(fmt)
    if not spec.quantized:
        raise ValueError(f"{fmt} is not quantized: it has no modelopt preset")
    preset = copy.deepcopy(getattr(mtq, spec.modelopt_preset))
    if device == "cpu":
        preset = with_cpu_backend(preset)
    return preset


def quantizer_cfg(fmt: str, device: str) -> dict[str, Any]:
    """modelopt's attributes for one weight or input quantizer in `fmt` (its own presets' values)."""
    entry = next(e for e in _preset(fmt, device)["quant_cfg"] if e.get("quantizer_name") == "*weight_quantizer")
    return copy.deepcopy(entry["cfg"])


def plan_config(plan: dict[str, str], device: str) -> dict[str, Any]:
    """A modelopt quantize config that puts each operator of `plan` (module name -> format) in its format.

    Everything else stays unquantized: the config disables every quantizer first, then enables
    the weight and input quantizers under each planned module (`<module>.*weight_quantizer*`
    also reaches the per-expert quantizers of fused experts). KV-cache quantizers stay off."""
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    for module, fmt in plan.items():
        if not format_named(fmt).quantized:
            continue
        cfg = quantizer_cfg(fmt, device)
        entries += [{"quantizer_name": f"{module}.*weight_quantizer*", "cfg": copy.deepcopy(cfg)},
                    {"quantizer_name": f"{module}.*input_quantizer", "cfg": copy.deepcopy(cfg)}]
    return {"quant_cfg": entries, "algorithm": "max"}


def search_formats(formats: list[str], device: str) -> list[dict[str, Any]]:
    """The candidate configs handed to modelopt's auto_quantize, one per format besides BF16."""
    return [_preset(fmt, device) for fmt in formats]
