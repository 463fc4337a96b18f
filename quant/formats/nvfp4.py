"""NVFP4: E2M1 codes in blocks of 16 along the reduction dimension, an E4M3 scale per block and an
FP32 scale per tensor; weights and input activations both (W4A4).

In the export a weight is U8, two E2M1 codes a byte (low nibble = even column), with `weight_scale`
F8_E4M3 [rows, cols/16] and `weight_scale_2` / `input_scale` FP32 scalars of amax / (6 * 448)
(docs/STACK.md). Storage: 4 bits per element plus an 8-bit block scale per 16 elements. On a CPU
modelopt cannot run it after calibration; quant/nvfp4_emulation.py emulates it there.
"""

from __future__ import annotations

import torch

from stagewise.quant.formats.spec import QuantFormat, Tensors
from stagewise.quant.nvfp4_emulation import E2M1_MAX, E4M3_MAX

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
"""FP4 (E2M1) code -> value; bit 3 is the sign."""
BLOCK = 16


def decode_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, scale_2: torch.Tensor) -> torch.Tensor:
    """Unpack [rows, cols/2] bytes (low nibble = even column) into [rows, cols] float32 values."""
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).long()
    values = E2M1[codes]
    blocks = values.reshape(*values.shape[:-1], block_scale.shape[-1], -1)
    return (blocks * (block_scale.float() * scale_2.float()).unsqueeze(-1)).reshape(values.shape)


def _decode(tensors: Tensors, base: str) -> torch.Tensor:
    return decode_nvfp4(tensors[base + "weight"], tensors[base + "weight_scale"], tensors[base + "weight_scale_2"])


def _amax(tensors: Tensors, base: str) -> tuple[float, float]:
    """The tensor scales are amax / (6 * 448), the weight's and the input's alike."""
    return (float(tensors[base + "weight_scale_2"]) * E2M1_MAX * E4M3_MAX,
            float(tensors[base + "input_scale"]) * E2M1_MAX * E4M3_MAX)


NVFP4 = QuantFormat(
    name="nvfp4", bits=4 + 8 / BLOCK,
    flop_cost=0.25,  # Blackwell's dense NVFP4 throughput is 4x BF16's
    colour="#76b900", modelopt_preset="NVFP4_DEFAULT_CFG", num_bits=(2, 1),
    stored_as="U8", packing=2, scales=("weight_scale", "weight_scale_2", "input_scale"),
    decode=_decode, amax=_amax, cpu_emulated=True,
)
