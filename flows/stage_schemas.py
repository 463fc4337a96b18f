"""Recipe blocks of the merge and long-context stages (composed into flows/recipe_schema.py).

They compose the libraries' configs (model.config, data.long_context_config) with the few
settings that only make sense at the stage level (which windows to try, which lengths to
probe), so each stage flow receives exactly its block.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from data.long_context_config import LongContextDataConfig
from model.config import MonitorConfig, OptimizerConfig, ScheduleConfig, TrainConfig
from model.scaleout.config import EngineChoice


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


class MergeStage(_Config):
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


class LongContextStage(EngineChoice):
    """Long-context continued pretraining: constant LR, a sequence-length mix, its own blend."""

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
