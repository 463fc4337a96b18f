"""The merge stage's recipe block (`stages.merge`): which windows of pretraining checkpoints to
merge and how, and when a merge is good enough to hand on (ALGORITHMS.md section 2, WSM)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from stagewise.engines.config import LaunchChoice
from stagewise.recipe.blocks.contract import Stretch

if TYPE_CHECKING:
    from stagewise.recipe.schema import Recipe


class MergeStage(LaunchChoice):
    """Checkpoint merging over pretraining's stable phase (ALGORITHMS.md section 2, WSM)."""

    windows_tokens: list[int] = Field(min_length=1)
    """Windows to merge, in tokens (e.g. 5, 10 and 20 checkpoint intervals); each is tried at every checkpoint."""
    schedule: Literal["minus-sqrt", "linear", "cosine", "uniform"] = "minus-sqrt"
    """Decay shape the merge coefficients emulate (uniform: plain average)."""
    ordering: Literal["sequential", "reversed", "random"] = "sequential"
    """How coefficients map to checkpoints (reversed/random are ablations)."""
    val_tokens: int = Field(32768, gt=0)
    """Held-out tokens scored per merged and trained checkpoint."""
    eval_suite: str | None = None
    """An eval suite (recipe `eval` block) also run on every trained and merged checkpoint (`merge/<window>/<task>/<metric>`)."""
    eval_limit: int | None = Field(20, gt=0)
    """Items per task of that suite (None: all); a merge sweep evaluates many checkpoints."""
    min_improvement: float = Field(0.0, ge=0)
    """Hand on the best merge only if its validation loss beats the last trained checkpoint's by more than this."""

    @model_validator(mode="after")
    def _positive(self) -> "MergeStage":
        bad = [w for w in self.windows_tokens if w <= 0]
        if bad:
            raise ValueError(f"windows_tokens must be > 0, got {bad}")
        return self

    def stretches(self, at: str) -> Iterator[Stretch]:
        """None: merging averages pretraining's checkpoints, it trains nothing."""
        return iter(())

    def budget_overrides(self, at: str, fraction: float, recipe: Recipe) -> list[str]:
        """None: it trains nothing, so there is no budget to scale."""
        return []
