"""The per-operator formats of the quantize stage: one file each, gathered here by name.

    from stagewise.quant.formats import FORMATS, format_named
    format_named("nvfp4").bits  # 4.5

A format is a `QuantFormat` (spec.py) holding everything quant/ and the report's chart need to
know about it. The config's allowed names (quant/config.py), the planner, the modelopt configs
(quant/quantizers.py), the FLOP model, the export's recount, the loader and the chart all read it
from here, so adding a format is one new file beside these and one line in FORMATS (its order is
the order the config's error message lists the names in and the chart's legend draws them).
tests/quant/test_format_registry.py checks that each entry is complete.
"""

from __future__ import annotations

from stagewise.quant.formats.bf16 import BF16
from stagewise.quant.formats.fp8 import FP8
from stagewise.quant.formats.nvfp4 import NVFP4
from stagewise.quant.formats.spec import QuantFormat

FORMATS: dict[str, QuantFormat] = {f.name: f for f in (NVFP4, FP8, BF16)}

UNQUANTIZED = BF16.name
"""The format that leaves an operator as it is: `keep_bf16`'s, the default of an unplanned operator,
always a choice of the search, and the baseline of both budgets."""


def format_named(name: str) -> QuantFormat:
    """The format called `name`; ValueError naming the known ones for any other name."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown quantization format {name!r}; formats: {', '.join(FORMATS)}") from None


def format_with_num_bits(num_bits: tuple[int, int]) -> QuantFormat:
    """The quantized format whose weight quantizer has `num_bits` (exponent, mantissa) in modelopt."""
    for f in FORMATS.values():
        if f.num_bits == tuple(num_bits):
            return f
    raise ValueError(f"no quantization format has modelopt num_bits {tuple(num_bits)}; formats: {', '.join(FORMATS)}")


def format_stored_as(dtype: str) -> QuantFormat | None:
    """The format whose exported weights have safetensors dtype `dtype` (None: an unquantized weight)."""
    return next((f for f in FORMATS.values() if f.stored_as == dtype), None)


__all__ = ["FORMATS", "UNQUANTIZED", "QuantFormat", "format_named", "format_stored_as", "format_with_num_bits"]
