"""What a quantization asks for: formats, a budget, pins and calibration sizes (typed, validated first).

One config serves the `quantize` stage's recipe block and `stagewise quantize`: the CLI builds
it from its flags, so both paths refuse the same bad input with the same words. The math of
the search is docs/ALGORITHMS.md section 8; what modelopt does on these machines is docs/STACK.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.quant.formats import FORMATS, UNQUANTIZED

Format = Literal[tuple(FORMATS)]  # type: ignore[valid-type]
"""A per-operator format, one of the registry's (quant/formats/: NVFP4, FP8, BF16 = not quantized).
A Literal rather than a validator so a bad name is refused by pydantic's own words, listing the
names in the registry's order ("Input should be 'nvfp4', 'fp8' or 'bf16'"), and the JSON schema
keeps its enum."""

QUANT_FORMATS: tuple[str, ...] = tuple(name for name, f in FORMATS.items() if f.quantized)
"""Formats the search may choose besides BF16 (BF16 is always a choice)."""


class Pin(StrictConfig):
    """Fix the format of every operator whose module name matches a glob pattern."""

    pattern: str = Field(min_length=1)
    """fnmatch pattern over module names, e.g. `*.mixer.experts` or `model.layers.3.*`."""
    format: Format
    """The format those operators get (bf16 keeps them unquantized)."""


class QuantizeConfig(StrictConfig):
    """Per-operator formats chosen under a budget (search), or the Ultra-style fixed heuristic."""

    preset: Literal["super", "ultra"] = "super"
    """super: AutoQuantize search by measured sensitivity under the budget (the Super report);
    ultra: the fixed heuristic of the Ultra report (routed experts NVFP4, shared experts and Mamba
    linears FP8, attention and everything else BF16), no search and no budget."""
    # The default is spelled out rather than QUANT_FORMATS: a new format must not change the default
    # config, whose dump is a step hash's input (store/steps.py).
    formats: list[Format] = Field(default_factory=lambda: ["nvfp4", "fp8"], min_length=1)
    """Formats the search may choose per operator; BF16 (no quantization) is always a choice."""
    budget: Literal["effective_bits", "flops"] = "effective_bits"
    """effective_bits: modelopt's own search under an average-bits budget over the searched weights;
    flops: our knapsack over modelopt's sensitivity scores under a compute budget (ALGORITHMS.md 8)."""
    effective_bits: float = Field(6.0, gt=0, le=16)
    """Average bits per searched weight element (NVFP4 counts 4.5: its block scales included)."""
    flop_fraction: float = Field(0.5, gt=0, le=1)
    """With budget=flops: the summed compute cost may be at most this share of the all-BF16 cost."""
    keep_bf16: list[str] = Field(default_factory=lambda: ["lm_head", "*.q_proj", "*.k_proj", "*.v_proj"])
    """Operators kept BF16 (fnmatch over module names): by default the output layer and attention
    Q/K/V, as both reports do. The embeddings are never quantized (a lookup, not a matmul)."""
    pins: list[Pin] = Field(default_factory=list)
    """Operators fixed to a format (applied after keep_bf16; a later pin wins over an earlier one)."""
    calib_batches: int = Field(16, gt=0)
    """Calibration batches (amax statistics) per candidate format."""
    score_batches: int = Field(8, gt=0)
    """Batches over which the gradient sensitivity scores are estimated."""
    batch_size: int = Field(4, gt=0)
    """Sequences per calibration/scoring batch."""
    seq_length: int = Field(256, gt=1)
    """Tokens per calibration sequence."""

    @model_validator(mode="after")
    def _formats(self) -> "QuantizeConfig":
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"formats: {self.formats} names a format twice")
        if UNQUANTIZED in self.formats:  # always a choice
            self.formats = [f for f in self.formats if f != UNQUANTIZED] or ["fp8"]
        return self
