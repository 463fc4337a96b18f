"""What the quantize stage needs to know about one per-operator format, in one frozen object.

Every part of quant/ that treats formats differently (the config's choices, the planner's bits and
FLOP costs, the modelopt presets, the export's recount, the loader's decoding and ranges, the
report and its chart) reads a `QuantFormat`, never a table of its own keyed by format name: a
format is then added by writing one of these (one file under quant/formats/) and naming it in the
registry (quant/formats/__init__.py). tests/quant/test_format_registry.py checks each one carries
what those readers need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

Tensors = dict[str, torch.Tensor]
"""The tensors of an export by name (its safetensors files read together)."""


@dataclass(frozen=True)
class QuantFormat:
    name: str
    """The name recipes, the CLI, plans and reports use (`nvfp4`, ...); also the metric suffix of
    `quant/{weight,flop}_share/<name>` and `quant/operators/<name>`."""
    bits: float
    """Storage bits per weight element as modelopt's search counts them and the export holds them
    (block scales included, per-tensor scalars not): the `effective_bits` budget's unit."""
    flop_cost: float
    """Tensor-core time per FLOP relative to BF16: the `flops` budget's unit (quant/flops.py)."""
    colour: str
    """The format's colour in the report's chart (eval/plots/quant.py), a matplotlib colour."""
    modelopt_preset: str | None = None
    """The `modelopt.torch.quantization` preset whose quantizer attributes the format takes
    (quant/quantizers.py); None for the unquantized format."""
    num_bits: tuple[int, int] | None = None
    """The (exponent, mantissa) bits of the preset's weight quantizer: how the planner tells which
    format one of modelopt's candidate recipes is (quant/plan.py `format_of`)."""
    stored_as: str | None = None
    """The safetensors dtype of a weight the export writes in this format: how the recount
    (quant/export.py) and the loader (quant/load.py) recognise it. None when the export's own dtype
    decides (the unquantized format)."""
    packing: int = 1
    """Weight elements per stored element (NVFP4: two 4-bit codes a byte)."""
    scales: tuple[str, ...] = ()
    """Suffixes of the scale tensors the export writes beside `<base>weight` (not weights themselves)."""
    decode: Callable[[Tensors, str], torch.Tensor] | None = None
    """(tensors, base) -> the float32 values of the exported weight `<base>weight`, from its codes and scales."""
    amax: Callable[[Tensors, str], tuple[float, float]] | None = None
    """(tensors, base) -> (weight amax, input amax) of `<base>weight`'s quantizers, from its exported
    scales: the loader sets the quantizers' ranges from them instead of recalibrating."""
    cpu_emulated: bool = False
    """Whether modelopt cannot run it on a CPU and quant/nvfp4_emulation.py's PyTorch emulation stands in
    (the report's `emulated`)."""

    @property
    def quantized(self) -> bool:
        """Whether the format quantizes at all (the unquantized one has no modelopt preset)."""
        return self.modelopt_preset is not None
