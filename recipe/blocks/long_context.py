"""The long-context stage's recipe block (`stages.long_context`): continued pretraining at long
sequence lengths, composing the libraries' configs (model.config, data.long_context_config) with
what only the stage decides (which lengths to probe with needles)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from stagewise.data.long_context_config import LongContextDataConfig
from stagewise.engines.config import EngineChoice
from stagewise.model.config import MonitorConfig, OptimizerConfig, ScheduleConfig, TrainConfig
from stagewise.recipe.blocks.contract import Stretch, scaled

if TYPE_CHECKING:
    from stagewise.recipe.schema import Recipe


class LongContextStage(EngineChoice):
    """Long-context continued pretraining: constant LR, a sequence-length mix, its own blend."""

    ENGINES: ClassVar[tuple[str, ...]] = ("torch", "megatron")

    tokens: int = Field(gt=0)
    """Token budget of the stage."""
    data: LongContextDataConfig = Field(default_factory=LongContextDataConfig)
    """Length mix, token budget per step, and the blend (document QA, retrieval, downscaled phase 2)."""
    optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=3e-4, min_lr=3e-4))
    """AdamW settings (the Nemotron recipe holds the LR constant here)."""
    schedule: ScheduleConfig = Field(default_factory=lambda: ScheduleConfig(kind="constant"))
    """Learning-rate schedule; constant by default."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 autocast on CUDA with bf16 support, fp32 otherwise."""
    lb_loss_coeff: float = Field(1e-3, ge=0)
    """Coefficient of the MoE load-balancing loss."""
    checkpoint_every_tokens: int | None = Field(None, gt=0)
    """Save a resumable checkpoint every N tokens (and always at the end)."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Monitors."""
    needle_lengths: list[int] = Field(default_factory=lambda: [256, 1024, 2048], min_length=1)
    """Context lengths at which retrieval accuracy and validation loss are measured, before and after."""
    needle_per_length: int = Field(24, gt=0)
    """Retrieval prompts per length."""

    def train_config(self) -> TrainConfig:
        """The engine's view: a step is `global_batch_tokens`, counted in rows of the shortest length."""
        base = min(x.length for x in self.data.lengths)
        return TrainConfig(
            tokens=self.tokens, seq_length=base, global_batch=self.data.global_batch_tokens // base, micro_batch=1,
            optimizer=self.optimizer, schedule=self.schedule, precision=self.precision,
            lb_loss_coeff=self.lb_loss_coeff, checkpoint_every_tokens=self.checkpoint_every_tokens,
            monitor=self.monitor,
        )

    def stretches(self, at: str) -> Iterator[Stretch]:
        """One stretch: continued pretraining on the pretraining data, a step being `global_batch_tokens`."""
        yield Stretch(at, self, "continued", step_tokens=self.data.global_batch_tokens)

    def budget_overrides(self, at: str, fraction: float, recipe: Recipe) -> list[str]:
        """Its stretch scaled: tokens, warmup and checkpoint interval shrink together."""
        return scaled(self.stretches(at), fraction)
