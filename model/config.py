"""Configs owned by the model library: which network to build and how to train it.

Every field carries a docstring (it becomes the field's description in `--help`, in the
JSON schema Prefect shows as a form, and in error messages). Token amounts are tokens,
never steps: the engine converts with seq_length x global_batch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig


class MTPConfig(StrictConfig):
    """Multi-token prediction heads (DeepSeek-V3 / Nemotron 3 style), trained next to the LM."""

    num_heads: int = Field(0, ge=0, le=4)
    """How many extra future tokens to predict (head k predicts token t+1+k); 0 disables MTP."""
    loss_weight: float = Field(0.3, ge=0.0)
    """Weight of the mean MTP loss added to the LM loss."""


class ModelConfig(StrictConfig):
    """The network: a named preset with overrides, or an existing HF-format checkpoint."""

    preset: str | None = "tiny"
    """Preset name (`stagewise inspect --presets` lists them): tiny, small, nemotron-3-nano-4b, ..."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """NemotronHConfig fields that replace the preset's (e.g. hybrid_override_pattern, hidden_size)."""
    from_: str | None = Field(None, alias="from")
    """Start from this HF-format checkpoint directory instead of a preset (its config wins)."""
    mtp: MTPConfig = Field(default_factory=MTPConfig)
    """Optional multi-token-prediction heads."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if self.from_ is not None and self.overrides:
            raise ValueError("give either `from` (a checkpoint) or `overrides` on a preset, not both")
        return self


class OptimizerConfig(StrictConfig):
    """AdamW with decoupled weight decay (no decay on norms, biases and embeddings)."""

    lr: float = Field(3e-3, gt=0)
    """Peak learning rate."""
    min_lr: float = Field(3e-5, ge=0)
    """Learning rate at the end of the decay (and after it)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas (Nemotron 3: 0.9, 0.95)."""
    eps: float = Field(1e-8, gt=0)
    """AdamW epsilon."""
    weight_decay: float = Field(0.1, ge=0)
    """Decoupled weight decay on matrices."""
    grad_clip: float = Field(1.0, ge=0)
    """Clip the global gradient norm to this value; 0 disables clipping."""


class ScheduleConfig(StrictConfig):
    """Learning-rate schedule over tokens (ALGORITHMS.md section 1)."""

    kind: Literal["constant", "cosine", "wsd"] = "wsd"
    """constant (after warmup), cosine (from warmup to the end), wsd (warmup-stable-decay)."""
    warmup_tokens: int = Field(0, ge=0)
    """Linear warmup from 0 to the peak over this many tokens."""
    decay: Literal["minus_sqrt", "linear", "cosine"] = "minus_sqrt"
    """Decay shape of the wsd schedule's last `decay_tokens`."""
    decay_tokens: int | None = Field(None, ge=0)
    """Length of the wsd decay in tokens; default `decay_fraction` of the total."""
    decay_fraction: float = Field(0.2, ge=0, le=1)
    """Used when decay_tokens is not set: the decay covers this fraction of the stage's tokens."""


class MonitorConfig(StrictConfig):
    """What the engine measures besides the loss, and how often."""

    log_every_steps: int = Field(1, gt=0)
    """Flush buffered metrics to the tracker every N optimizer steps."""
    act_rms_every_steps: int = Field(10, gt=0)
    """Measure the residual-stream RMS after every layer every N steps."""
    dead_expert_window: int = Field(20, gt=0)
    """An expert that receives no token over this many steps is counted dead."""


class TrainConfig(StrictConfig):
    """How one training stage runs: batch geometry, optimizer, schedule, precision, checkpoints."""

    tokens: int = Field(gt=0)
    """Token budget of the stage."""
    seq_length: int = Field(256, gt=1)
    """Tokens per training sequence."""
    global_batch: int = Field(16, gt=0)
    """Sequences per optimizer step (all micro-batches and ranks together)."""
    micro_batch: int = Field(8, gt=0)
    """Sequences per forward/backward; global_batch must be a multiple of it."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """AdamW settings."""
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 autocast on CUDA with bf16 support, fp32 otherwise."""
    lb_loss_coeff: float = Field(1e-3, ge=0)
    """Coefficient of the Switch load-balancing loss on MoE layers (0 disables it)."""
    checkpoint_every_tokens: int | None = Field(None, gt=0)
    """Save a resumable checkpoint every N tokens (and always at the end)."""
    keep_checkpoints: int | None = Field(None, gt=0)
    """Keep only the newest N intermediate checkpoints (None keeps all; merging needs them)."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Monitors."""

    @model_validator(mode="after")
    def _geometry(self) -> "TrainConfig":
        if self.global_batch % self.micro_batch:
            raise ValueError(
                f"global_batch ({self.global_batch}) must be a multiple of micro_batch ({self.micro_batch})"
            )
        if self.tokens < self.tokens_per_step:
            raise ValueError(f"tokens ({self.tokens}) is less than one step ({self.tokens_per_step} tokens)")
        return self

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step."""
        return self.seq_length * self.global_batch

    @property
    def total_steps(self) -> int:
        """Optimizer steps in the stage (the budget rounded down to whole steps)."""
        return self.tokens // self.tokens_per_step


LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "up_proj", "down_proj")
"""model/lora.py's default targets (attention, Mamba in_proj, dense and shared-expert MLPs)."""


class LoRAConfig(StrictConfig):
    """Train low-rank adapters instead of every weight (model/lora.py); merged into a plain checkpoint."""

    r: int = Field(16, gt=0)
    """Adapter rank."""
    alpha: float = Field(32.0, gt=0)
    """Scale: the update is (alpha / r) B A."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_DEFAULT_TARGETS))
    """Module-name suffixes that get adapters (not the Mamba out_proj: its fused kernel skips adapters)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input."""

    @model_validator(mode="after")
    def _targets(self) -> "LoRAConfig":
        if not self.target_modules:
            raise ValueError("target_modules must name at least one module")
        if "out_proj" in self.target_modules:
            raise ValueError("target_modules may not include 'out_proj' (Mamba): the fused mamba-ssm kernel bypasses its adapter")
        return self
