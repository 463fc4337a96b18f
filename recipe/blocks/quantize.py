"""The recipe block of the quantize stage (`stages.quantize`), composed into recipe/schema.py.

It is the library's QuantizeConfig (formats, budget, pins, calibration sizes: quant/config.py)
plus what only the stage decides: what calibrates it, what it is scored on, and how closely.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import Field

from stagewise.engines.config import LaunchChoice
from stagewise.quant.config import QuantizeConfig
from stagewise.recipe.blocks.contract import Stretch

if TYPE_CHECKING:
    from stagewise.recipe.schema import Recipe


class QuantizeStage(QuantizeConfig, LaunchChoice):
    """Per-operator NVFP4 / FP8 / BF16 under a budget (or the Ultra heuristic), exported for deployment."""

    calib: str | None = None
    """Calibration text: a JSONL file (`text` per line) or a text file, relative to the recipe;
    default the recipe's validation text (the prepared data's held-out shards)."""
    heldout: str | None = None
    """Held-out conversations scored BF16 vs quantized (greedy exact match) on their test split
    (eval/splits.py: nothing in the search reads them); default the SFT world's
    `@world/sft_eval.jsonl` when the recipe has one."""
    heldout_limit: int | None = Field(200, gt=0)
    """Held-out test conversations answered per model (None: all)."""
    val_tokens: int = Field(16384, gt=0)
    """Validation tokens scored per model (validation loss)."""
    eval_suite: str | None = None
    """An eval suite (recipe `eval` block) scored on both models as well."""
    eval_limit: int | None = Field(40, gt=0)
    """Items per task of that suite (None: all)."""
    max_drop: float | None = Field(None, ge=0)
    """Fail the stage when held-out exact match drops by more than this (None: report only); the
    closing table calls the change `kept` when its 95% interval stays within it (eval/intervals.py)."""

    def stretches(self, at: str) -> Iterator[Stretch]:
        """None: quantization calibrates and exports, it trains nothing."""
        return iter(())

    def budget_overrides(self, at: str, fraction: float, recipe: Recipe) -> list[str]:
        """None: it trains nothing, so there is no budget to scale (its calibration sizes are not a budget)."""
        return []
