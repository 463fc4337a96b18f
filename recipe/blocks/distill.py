"""The recipe block of the distillation stage (`stages.distill`), composed into recipe/schema.py.

Multi-teacher on-policy distillation (MOPD, docs/ALGORITHMS.md section 7): the student samples
responses to the stage's prompts, each response is scored by the one teacher that covers its
prompt's domain, and the student learns from the per-token signal log π_T - log π_S with RL's
clipping and masked importance sampling. The prompts are RL task rows (`data`, the same block
as `stages.rl.data`): their verifiers score held-out pass@1, never the loss.

A teacher is one of: a checkpoint directory, the checkpoint an earlier stage of the run
handed on (`stage: rl`), or an RL run trained here from the student's start (`rl: {}`: the
recipe's `stages.rl` block with these overrides, on the teacher's domains only). With
`rounds: 2` the stage runs twice, the second round's RL teachers trained from the first
round's student.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.model.rl_batches import SamplingSettings
from stagewise.recipe.blocks.on_policy import OnPolicyStage
from stagewise.recipe.blocks.rl import RLData, RLStage

if TYPE_CHECKING:
    from stagewise.recipe.schema import Recipe


class TeacherSpec(StrictConfig):
    """One teacher and the domains it covers."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Its name (MLflow runs and metrics, the checkpoint alias of an `rl` teacher: distill-teacher-<name>)."""
    domains: list[str] = Field(min_length=1)
    """The prompt domains it scores (each domain has at most one teacher)."""
    checkpoint: str | None = None
    """A checkpoint directory (relative to the recipe, or absolute)."""
    stage: str | None = None
    """An earlier stage of this run whose handed-on checkpoint is the teacher (e.g. rl)."""
    rl: dict[str, Any] | None = None
    """Train the teacher here: the recipe's stages.rl block with these overrides ({} for none), on
    this teacher's domains only, from the student's starting checkpoint (each round's)."""
    url: str | None = None
    """teacher_backend vllm: where this teacher's vLLM server listens (one server per teacher)."""

    @model_validator(mode="after")
    def _one_source(self) -> "TeacherSpec":
        given = [k for k in ("checkpoint", "stage", "rl") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"teacher {self.name!r}: give exactly one of checkpoint, stage, rl "
                             f"(got {', '.join(given) or 'none'})")
        return self


class DistillStage(OnPolicyStage):
    """Multi-teacher on-policy distillation (docs/ALGORITHMS.md section 7)."""

    ENGINES: ClassVar[tuple[str, ...]] = ("torch", "nemo_rl")

    data: RLData | None = None
    """Prompts (RL task rows) the student answers, and held-out rows for pass@1 (None: stages.rl.data)."""
    teachers: list[TeacherSpec] = Field(min_length=1)
    """The teachers; each prompt is routed to the teacher of its domain."""
    default_teacher: str | None = None
    """The teacher of a domain no teacher lists (None: such a prompt is an error)."""
    student: str | None = None
    """Where the student starts: None (the checkpoint the previous stage handed on), an earlier
    stage's name (e.g. sft), or a checkpoint directory."""
    rounds: int = Field(1, ge=1, le=8)
    """Rounds of the stage; round r > 1 retrains the rl teachers from round r-1's student."""
    steps: int = Field(gt=0)
    """Optimizer steps per round (one batch of student samples each)."""
    prompts_per_step: int = Field(32, gt=0)
    """Prompts per step; each is sampled rollout.group_size times."""
    rollout: SamplingSettings = Field(default_factory=SamplingSettings)
    """Student sampling: responses per prompt, length, temperature, one-step off-policy."""
    discount: float = Field(0.0, ge=0, le=1)
    """0: each token's advantage is its own log π_T - log π_S (the published recipe); > 0 adds the
    discounted later tokens of the response."""
    teacher_backend: Literal["hf", "vllm"] = "hf"
    """hf: teachers loaded once in this process (eval mode); vllm: one vLLM server per teacher
    (each teacher's `url`), returning prompt log-probs (GPU extra)."""
    eval_suite: str | None = None
    """Suite of the recipe's `eval` block scored on the student before and after (retention)."""
    eval_limit: int | None = Field(None, gt=0)
    """Items per task of the suite (None: all)."""
    retention_margin: float = Field(0.05, ge=0)
    """Largest drop of any suite score the stage accepts; a larger one is logged
    (distill/retained = 0) and said in the log."""

    @model_validator(mode="after")
    def _consistent(self) -> "DistillStage":
        names = [t.name for t in self.teachers]
        if len(set(names)) != len(names):
            raise ValueError(f"teacher names must be unique, got {names}")
        owner: dict[str, str] = {}
        for t in self.teachers:
            for d in t.domains:
                if d in owner:
                    raise ValueError(f"domain {d!r} has two teachers ({owner[d]}, {t.name}): route it to one")
                owner[d] = t.name
        if self.default_teacher is not None and self.default_teacher not in names:
            raise ValueError(f"default_teacher {self.default_teacher!r} is not a teacher; teachers: {', '.join(names)}")
        if self.rounds > 1 and any(t.rl is None for t in self.teachers):
            fixed = ", ".join(t.name for t in self.teachers if t.rl is None)
            raise ValueError(f"rounds > 1 retrains teachers from the last round's student: every teacher needs "
                             f"an `rl` block ({fixed} has none)")
        if self.loss.kl_coeff > 0:
            raise ValueError("loss.kl_coeff must be 0: the distillation signal is already a KL (to the teacher)")
        if self.teacher_backend == "vllm":
            missing = [t.name for t in self.teachers if not t.url]
            if missing:
                raise ValueError(f"teacher_backend vllm: teachers {', '.join(missing)} need a `url`")
            if self.rollout.temperature != 1.0:
                raise ValueError("teacher_backend vllm scores at temperature 1 (vLLM's prompt log-probs are unscaled): "
                                 "set rollout.temperature: 1.0")
        return self

    def routes(self) -> dict[str, str]:
        """domain -> teacher name."""
        return {d: t.name for t in self.teachers for d in t.domains}

    def budget_overrides(self, at: str, fraction: float, recipe: Recipe) -> list[str]:
        """Its steps and checkpoint interval scaled, and every `rl` teacher's steps (a teacher's `rl`
        overrides the recipe's stages.rl; a teacher given as a checkpoint or a stage trains nothing here)."""
        rl_steps = recipe.stages.rl.steps if recipe.stages.rl else None
        teachers = [f"{at}.teachers[{i}].rl.steps={max(1, round(steps * fraction))}"
                    for i, t in enumerate(self.teachers) if t.rl is not None
                    for steps in [t.rl.get("steps", rl_steps)] if steps]
        return super().budget_overrides(at, fraction, recipe) + teachers

    def results_named(self, at: str) -> list[str]:
        """`field: value` of every earlier stage's result this block names (`student: sft`, `stage:`
        teachers): what the stage does not have when it runs alone (an ablation)."""
        from stagewise.recipe.schema import STAGE_ORDER  # noqa: PLC0415 (circular: recipe.schema imports this block)

        named = [f"{at}.teachers[{i}].stage: {t.stage}" for i, t in enumerate(self.teachers) if t.stage]
        return ([f"{at}.student: {self.student}"] if self.student in STAGE_ORDER else []) + named


def teacher_rl_block(spec: TeacherSpec, base: RLStage | None) -> RLStage:
    """An `rl` teacher's RL block: the recipe's stages.rl with the teacher's overrides (deep-merged).
    ValueError / ValidationError when there is no base block or the result does not validate."""
    if base is None:
        raise ValueError(f"teacher {spec.name!r}: an `rl` teacher starts from the recipe's stages.rl block; add one")
    fields = base.model_dump(exclude_unset=True, by_alias=True)
    fields.get("grpo", {}).pop("temperature", None)  # follows the (possibly overridden) rollout temperature
    return RLStage.model_validate(_deep_merge(fields, spec.rl or {}))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
