"""The recipe block of the RL stage (`stages.rl`), composed into recipe/schema.py.

It composes the libraries' configs (model.rl_batches.RolloutSettings, model.objectives.grpo
.GRPOConfig, data.rl_curriculum.CurriculumConfig, eval.rewards.RewardConfig) with what only
the stage decides: where the task rows come from, how many steps, the difficulty profile and
held-out evaluation. RL budgets are optimizer steps (one step = `prompts_per_step` x
`group_size` rollouts), as in every published RL recipe; the engine converts them to its
token count internally.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.data.rl_curriculum import CurriculumConfig
from stagewise.eval.rewards import RewardConfig
from stagewise.model.objectives.grpo import GRPOConfig
from stagewise.model.rl_batches import PlateauRule, RolloutSettings
from stagewise.recipe.blocks.on_policy import OnPolicyStage


class RLWorldConfig(StrictConfig):
    """The demo world's verifiable task rows (written under <workdir>/rl_world/)."""

    per_domain: int = Field(600, gt=0)
    """Rows per domain (arithmetic, format, calculator, sorting) before the held-out split."""
    eval_fraction: float = Field(0.15, gt=0, lt=1)
    """Share of prompts held out (by prompt hash) into rl_eval.jsonl: scored, never trained on."""
    entities: int | None = Field(None, gt=0)
    """Entity count for fact questions (default: the pretraining world's `facts`)."""
    max_digits: int | None = Field(None, gt=0)
    """Numbers in arithmetic and JSON-sum prompts have at most this many digits (1: mental
    arithmetic, what a tiny model can sometimes get right; None: the SFT world's mix)."""
    format_kinds: list[Literal["json_answer", "uppercase"]] | None = None
    """Which format rows to write (None: both; uppercase includes recalled entity facts)."""


class RLSource(StrictConfig):
    """Task rows (a NeMo Gym-compatible subset: responses_create_params.input, expected_answer...)."""

    name: str
    """Source name (the domain too, unless `domain` or the rows say otherwise)."""
    path: str
    """A JSONL, parquet or Arrow file, or a directory as teams keep them (a Hugging Face Hub shard
    folder or a `datasets` save_to_disk directory: its `train` split; data/row_files.py); relative
    to the recipe, absolute, or `@world/<file>` for the demo world's rows."""
    domain: str | None = None
    """Domain of every row (default: each row's `domain`, else the source name)."""
    environment: str | None = None
    """Verifier of every row (default: each row's `environment` key): exact_answer, json_answer, uppercase,
    calculator or sorting (eval/environments/; a new one is a function and a registry line)."""
    on_bad_line: Literal["error", "skip"] = "error"
    """A malformed row stops the stage naming its line (error) or is skipped and counted (skip)."""


class RLData(StrictConfig):
    """Task rows to train on and to score."""

    world: RLWorldConfig | None = None
    """Generate the demo world's rows (train: rl_<domain>.jsonl, held out: rl_eval.jsonl)."""
    sources: list[RLSource] = Field(min_length=1)
    """Training rows."""
    heldout: str | None = None
    """Held-out rows for pass@1 before and after (default with a world: @world/rl_eval.jsonl), split
    by prompt hash into dev (`rl/dev/...`: what tuning and ablations compare) and test (`rl/test/...`:
    what the closing table reports) (eval/splits.py)."""
    heldout_limit: int | None = Field(240, gt=0)
    """Held-out rows scored per split, taken round-robin over domains (None: all)."""
    heldout_samples: int = Field(8, gt=0)
    """Responses per held-out prompt for pass@1 (the mean verifier result at the rollout temperature)."""


class DifficultyFilter(StrictConfig):
    """Profile every training prompt with the starting policy and drop the ones it always solves."""

    samples: int = Field(8, ge=2)
    """k: responses per prompt for its pass rate."""
    drop_solved: bool = True
    """Drop prompts solved k/k (no signal left)."""
    drop_unsolved: bool = False
    """Also drop prompts solved 0/k (default: kept and counted; the curriculum weighs them late)."""


class RLStage(OnPolicyStage):
    """GRPO on verifiable rewards (docs/ALGORITHMS.md sections 5 and 6)."""

    ENGINES: ClassVar[tuple[str, ...]] = ("torch", "nemo_rl")

    data: RLData
    """Task rows, held-out rows."""
    steps: int = Field(gt=0)
    """Optimizer steps (one rollout batch each, or every `rollout.minibatches` steps)."""
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    """Group size, response length, temperature, one-step off-policy, minibatches per rollout batch (and
    where their π_old comes from), the sampler's precision (model/rl_batches.py)."""
    loss: GRPOConfig = Field(default_factory=GRPOConfig, alias="grpo")
    """Clipping, masked importance sampling, KL (its temperature is the rollout's). The recipe key is
    `grpo` (its name before the on-policy blocks shared one loss key; `loss` is accepted too)."""
    filter: DifficultyFilter | None = Field(default_factory=DifficultyFilter)
    """The difficulty profile (None: no profile, every prompt kept at pass rate 0.5)."""
    curriculum: CurriculumConfig | None = Field(default_factory=CurriculumConfig)
    """Gaussian curriculum over pass rates, easy to hard (None: uniform within each domain). It needs
    the profile: with `filter: null` the default one is dropped and an explicit one refused."""
    reprofile: PlateauRule | None = None
    """Re-profile the training prompts with the current policy when the training reward stalls,
    so the curriculum weighs what is hard now (None: the starting profile throughout)."""
    rewards: RewardConfig = Field(default_factory=RewardConfig)
    """Reward components and their weights."""

    @model_validator(mode="after")
    def _curriculum_needs_a_profile(self) -> "RLStage":
        """The curriculum samples by the profile's pass rates: without one every prompt sits at 0.5 and
        a curriculum is uniform sampling in disguise. Asked for, it is refused; by default it goes."""
        if self.filter is None and self.curriculum is not None:
            if "curriculum" in self.model_fields_set:
                raise ValueError("curriculum: a Gaussian curriculum samples by the difficulty profile's pass rates, "
                                 "and `filter: null` profiles nothing (every prompt would sit at 0.5: uniform "
                                 "sampling); set a filter or `curriculum: null`")
            self.curriculum = None
        return self

    @model_validator(mode="after")
    def _reprofile_needs_a_curriculum(self) -> "RLStage":
        if self.reprofile is not None and self.curriculum is None:
            raise ValueError("reprofile only changes what a curriculum samples: set a curriculum or drop reprofile")
        return self

    @model_validator(mode="after")
    def _whole_rollout_batches(self) -> "RLStage":
        k = self.rollout.minibatches
        if self.steps % k:
            raise ValueError(f"steps ({self.steps}) must be a multiple of rollout.minibatches ({k}): "
                             "every rollout batch is trained whole")
        return self
