"""The pretraining stage's recipe block (`stages.pretrain`): one LR schedule over the stage, blends
switching at token fractions, an optional gate, on our engine or a launched one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from stagewise.data.config import PhaseConfig
from stagewise.engines.config import EngineChoice
from stagewise.eval.gates import GateConfig
from stagewise.eval.metric_names import VALIDATION_PREFIX, validation_metric_names
from stagewise.model.config import TrainConfig
from stagewise.recipe.blocks.contract import Stretch, scaled

if TYPE_CHECKING:
    from stagewise.recipe.schema import Recipe


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

    def stretches(self, at: str) -> Iterator[Stretch]:
        """One stretch, the whole stage: the recipe's pretraining, whose peak LR later stages are judged against."""
        yield Stretch(at, self, "pretrain", step_tokens=self.tokens_per_step, gate=self.gate)

    def budget_overrides(self, at: str, fraction: float, recipe: Recipe) -> list[str]:
        """Its stretch scaled: tokens, warmup and checkpoint interval shrink together; the gate is left out."""
        return scaled(self.stretches(at), fraction)

    def gate_metrics(self, recipe: Recipe) -> set[str]:
        """At a gate's marks pretraining scores the validation loss of every pretraining source (flows/pretrain.py)."""
        return {f"{VALIDATION_PREFIX}/{n}" for n in validation_metric_names(s.name for s in recipe.data.sources)}
