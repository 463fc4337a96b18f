"""What the RL and distillation blocks share: an on-policy trainer's sampling, loss and optimizer.

Both stages sample responses from the policy, score every token (RL: a verifier's reward, spread
by GRPO's group advantage; distillation: a teacher's log-probability against the student's) and
train through the same clipped, importance-sampled loss (model/objectives/grpo.py). So the keys
that describe that trainer are declared once, here; each stage's block adds what only it decides
(RL: rewards, the difficulty filter, the curriculum; distillation: the teachers and rounds).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from stagewise.engines.config import EngineChoice, NemoGym, where_free
from stagewise.model.config import MonitorConfig, OptimizerConfig, ScheduleConfig, TrainConfig
from stagewise.model.objectives.grpo import GRPOConfig
from stagewise.model.rl_batches import SamplingSettings
from stagewise.recipe.blocks.contract import Stretch, scaled

if TYPE_CHECKING:
    from stagewise.model.runtime import Runtime
    from stagewise.recipe.schema import Recipe


class OnPolicyStage(EngineChoice):
    """An on-policy trainer's keys (docs/ALGORITHMS.md sections 5 to 7)."""

    steps: int = Field(gt=0)
    """Optimizer steps."""
    prompts_per_step: int = Field(16, gt=0)
    """Prompts per rollout batch; each is sampled rollout.group_size times."""
    domains: dict[str, float] | None = None
    """Share of each domain in every batch (default: equal over the sources' domains)."""
    rollout: SamplingSettings = Field(default_factory=SamplingSettings)
    """Sampling: responses per prompt, length, temperature, one-step off-policy, the sampler's
    precision (sampler_precision: trainer, or bf16 for a sampler whose numerics differ)."""
    loss: GRPOConfig = Field(default_factory=GRPOConfig)
    """Clipping, masked importance sampling, KL (its temperature is the rollout's)."""
    optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-4, min_lr=1e-4, weight_decay=0.0))
    """AdamW settings."""
    schedule: ScheduleConfig = Field(default_factory=lambda: ScheduleConfig(kind="constant"))
    """Learning-rate schedule (constant by default)."""
    micro_batch: int = Field(64, gt=0)
    """Responses per forward/backward."""
    reasoning: bool = False
    """Render prompts with reasoning on (the model thinks first) or off (it answers directly)."""
    backend: Literal["hf", "hf-process", "vllm"] = "hf"
    """Rollout backend: hf (transformers' generate in process, CPU or GPU), hf-process (the same in a
    worker process, so off-policy sampling overlaps training without the GIL), or vllm (a vLLM
    server, model/rollout/vllm.py: the stage starts one on its starting checkpoint unless
    `vllm_url` names a running one; its weights follow the trainer's every rollout step)."""
    worker_threads: int = Field(1, ge=1)
    """hf-process: torch threads of the rollout worker (the trainer keeps the rest)."""
    vllm_url: str | None = None
    """backend vllm: a running server's URL; None starts one for the stage (STAGEWISE_VLLM_PYTHON's
    vLLM, model/vllm_server.py) and stops it with the stage."""
    vllm_weight_sync: Literal["files", "nccl"] = "files"
    """backend vllm: how the trainer's weights reach the server: files (written as safetensors and
    reloaded by the server, CPU or GPU, the server on this machine or a shared file system) or nccl
    (TRL's broadcast from a CUDA device into a server at `vllm_url` started with TRL's flags)."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 autocast on CUDA with bf16 support, fp32 otherwise."""
    checkpoint_every_steps: int | None = Field(None, gt=0)
    """Save a resumable checkpoint every N steps (and always at the end)."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Monitors."""
    nemo_gym: NemoGym | None = None
    """engine nemo_rl: the NeMo Gym agents that verify the rows there (None: none given)."""

    @model_validator(mode="after")
    def _loss_temperature_is_the_rollouts(self) -> "OnPolicyStage":
        """The trainer's log-probs must be taken at the temperature the samples were drawn at."""
        key = type(self).model_fields["loss"].alias or "loss"  # as the recipe spells it (RL: grpo)
        if "temperature" in self.loss.model_fields_set and self.loss.temperature != self.rollout.temperature:
            raise ValueError(f"{key}.temperature must equal rollout.temperature (set rollout.temperature only)")
        self.loss = self.loss.model_copy(update={"temperature": self.rollout.temperature})
        return self

    @model_validator(mode="after")
    def _sampler_precision_is_the_hf_backends(self) -> "OnPolicyStage":
        """sampler_precision casts the hf / hf-process backends' copy of the policy; a vLLM server (and
        NeMo RL's) samples in the dtype it was started with."""
        if self.rollout.sampler_precision != "trainer" and (self.backend == "vllm" or self.engine != "torch"):
            where = "backend vllm" if self.backend == "vllm" else f"engine {self.engine}"
            raise ValueError(f"rollout.sampler_precision: {self.rollout.sampler_precision} applies to the hf and "
                             f"hf-process backends on engine torch; with {where} the sampler's precision is its "
                             "server's (set it there), so leave sampler_precision at trainer")
        return self

    @model_validator(mode="after")
    def _nccl_needs_a_running_server(self) -> "OnPolicyStage":
        """NCCL weight sync joins a server started with TRL's weight-transfer flags: the stage cannot start it."""
        if self.backend == "vllm" and self.vllm_weight_sync == "nccl" and not self.vllm_url:
            raise ValueError("vllm_weight_sync: nccl broadcasts into a server started with TRL's weight-transfer "
                             "flags: give its vllm_url (or use vllm_weight_sync: files, and the stage starts its own)")
        return self

    def samples_per_step(self) -> int:
        """Rows of one optimizer step: a rollout batch's samples over the steps it is trained as."""
        return max(1, self.prompts_per_step * self.rollout.group_size // self.rollout.optimizer_steps())

    def steps_train_config(self, prompts: Mapping[Any, Any], runtime: Runtime) -> TrainConfig:
        """The engine's config for this stage's budget of optimizer steps (each `samples_per_step` sampled
        responses): the engine counts tokens, so a step is its rows of the longest prompt (`prompts`:
        id -> rendered prompt with `.ids`) plus rollout.max_new_tokens, at `runtime`'s precision."""
        seq_length = max(len(p.ids) for p in prompts.values()) + self.rollout.max_new_tokens
        rows = self.samples_per_step()
        every = self.checkpoint_every_steps
        return TrainConfig(
            tokens=self.steps * seq_length * rows, seq_length=seq_length, global_batch=rows,
            micro_batch=math.gcd(rows, self.micro_batch), optimizer=self.optimizer, schedule=self.schedule,
            precision=runtime.precision_for(self.precision), lb_loss_coeff=0.0,
            checkpoint_every_tokens=every * seq_length * rows if every else None, monitor=self.monitor)

    def stretches(self, at: str) -> Iterator[Stretch]:
        """One fine-tuning stretch budgeted in optimizer steps (warmup is not judged in tokens)."""
        yield Stretch(at, self, "finetune")

    def budget_overrides(self, at: str, fraction: float, recipe: Recipe) -> list[str]:
        """Its steps and checkpoint interval scaled."""
        return scaled(self.stretches(at), fraction)


LEGACY_VLLM_URL = "http://127.0.0.1:8000"
"""`vllm_url`'s default until 2026-12: what a spec that hashes the key reads for an unset one."""


def block_spec(stage: OnPolicyStage, exclude: set[str]) -> dict:
    """An RL or distill block as a step spec without `exclude`, keys as the recipe spells them;
    `nemo_gym` only when given (it matters only to engine nemo_rl) and `rollout.sampler_precision`
    only when not `trainer` (what every step sampled with before the key existed), `vllm_weight_sync`
    only when not `files`, and an unset `vllm_url` as LEGACY_VLLM_URL (the key's default before a stage
    could start its own server), so a step finished before those keys existed keeps its hash."""
    stage = where_free(stage)
    unset: dict = {k: True for k in exclude}
    if stage.nemo_gym is None:
        unset["nemo_gym"] = True
    if stage.rollout.sampler_precision == "trainer" and "rollout" not in unset:
        unset["rollout"] = {"sampler_precision": True}
    if stage.vllm_weight_sync == "files":
        unset["vllm_weight_sync"] = True
    spec = stage.model_dump(exclude=unset, by_alias=True)
    if "vllm_url" in spec and spec["vllm_url"] is None:  # where a spec hashes it (distillation's RL block)
        spec["vllm_url"] = LEGACY_VLLM_URL
    return spec
