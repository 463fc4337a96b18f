"""The pretraining stage's recipe block (`stages.pretrain`): one LR schedule over the stage, blends
switching at token fractions, an optional gate, on our engine or a launched one."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from stagewise.data.config import PhaseConfig
from stagewise.eval.gates import GateConfig
from stagewise.model.config import TrainConfig
from stagewise.recipe.blocks.engine import EngineChoice


class PretrainStage(TrainConfig, EngineChoice):
    """Phased pretraining: one LR schedule over the stage, blends switching at token fractions."""

    ENGINES: ClassVar[tuple[str, ...]] = ("torch", "megatron")

    phases: list[PhaseConfig] = Field(min_length=1)
    """The curriculum: e.g. a diversity blend until 0.8, then a quality blend until 1.0."""
    val_tokens: int = Field(65536, gt=0)
    """Held-out tokens scored for the validation loss (per evaluation)."""
    eval_suite: str | None = None
    """An eval suite (recipe `eval` block) run at each phase end and gate mark, besides validation loss."""
    gate: GateConfig | None = None
    """Stop the stage early when this rule holds on its evaluations (see eval/gates.py)."""
