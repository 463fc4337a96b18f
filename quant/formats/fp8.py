"""FP8: E4M3 with one FP32 scale per tensor; weights and input activations both (W8A8).

In the export a weight is F8_E4M3 with FP32 `weight_scale` and `input_scale` scalars of
amax / 448 (docs/STACK.md). modelopt fake-quantizes it on a CPU as well as on a GPU.
"""

from __future__ import annotations

import torch

from stagewise.quant.formats.spec import QuantFormat, Tensors

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
"""448: the scales are amax / 448."""


def _decode(tensors: Tensors, base: str) -> torch.Tensor:
    return tensors[base + "weight"].float() * tensors[base + "weight_scale"].float()


def _amax(tensors: Tensors, base: str) -> tuple[float, float]:
    return float(tensors[base + "weight_scale"]) * E4M3_MAX, float(tensors[base + "input_scale"]) * E4M3_MAX


FP8 = QuantFormat(
    name="fp8", bits=8.0,
    flop_cost=0.5,  # Blackwell's dense FP8 throughput is 2x BF16's
    colour="#1f77b4", modelopt_preset="FP8_DEFAULT_CFG", num_bits=(4, 3),
    stored_as="F8_E4M3", scales=("weight_scale", "input_scale"),
    decode=_decode, amax=_amax,
)
