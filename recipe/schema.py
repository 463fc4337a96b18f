"""The recipe's typed schema: the pydantic models a recipe YAML validates into, and its stages.

The models compose the libraries' own configs (model.config, data.config, data.sft_config,
eval.gates) in one block per stage (recipe/blocks/) with the few settings that
exist only at the recipe level. The checks that span blocks are not validators here: the loader
runs them after validation (recipe/checks.py, engines/checks.py), so no block imports a check. STAGE_ORDER is StagesConfig's fields: a stage's name is written once, as its block's field, and
every other list of stages (the engines each can have, the flow registry's order) derives from it
or is checked against it; select_stages() checks `--stages` against a recipe.
Reading YAML into these models is recipe/loader.py's job.
"""

from __future__ import annotations

import typing

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.data.config import DataConfig, TokenizerConfig
from stagewise.engines.launch_text import PlainPath, RecipeName
from stagewise.eval.task_spec import SuiteEntry
from stagewise.model.config import ModelConfig
from stagewise.model.runtime import RuntimeConfig
from stagewise.recipe.blocks.distill import DistillStage
from stagewise.recipe.blocks.long_context import LongContextStage
from stagewise.recipe.blocks.merge import MergeStage
from stagewise.recipe.blocks.pretrain import PretrainStage
from stagewise.recipe.blocks.quantize import QuantizeStage
from stagewise.recipe.blocks.rl import RLStage
from stagewise.recipe.blocks.sft import SFTStage
from stagewise.recipe.errors import RecipeError, did_you_mean


class TrackingConfig(StrictConfig):
    """Where MLflow records go."""

    uri: str | None = None
    """MLflow tracking URI; default a SQLite store at <workdir>/mlflow.db."""
    experiment: str | None = None
    """MLflow experiment; default the recipe name."""


class StagesConfig(StrictConfig):
    """One optional block per stage; a stage runs when its block is present."""

    pretrain: PretrainStage | None = None
    """Phased pretraining."""
    merge: MergeStage | None = None
    """Merge pretraining checkpoints over windows (decay emulation) and hand on the best."""
    long_context: LongContextStage | None = None
    """Long-context continued pretraining from the (merged) pretraining checkpoint."""
    sft: SFTStage | None = None
    """Supervised fine-tuning on curated, packed conversations (after pretraining)."""
    rl: RLStage | None = None
    """GRPO on verifiable rewards (difficulty filter, Gaussian curriculum, masked IS, one-step off-policy)."""
    distill: DistillStage | None = None
    """Multi-teacher on-policy distillation: the student samples, per-domain teachers score its tokens."""
    quantize: QuantizeStage | None = None
    """Per-operator NVFP4 / FP8 / BF16 under a budget (AutoQuantize) and a deployable export (after training)."""


class Recipe(StrictConfig):
    """A whole training recipe."""

    name: RecipeName
    """Recipe name, a slug; also the MLflow experiment unless tracking.experiment is set."""
    seed: int = 1234
    """Seeds data generation, sampling, initialisation and dropout."""
    workdir: PlainPath = "runs/${name}"
    """Where data, checkpoints and the default MLflow store live (relative to the current directory)."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """MLflow settings."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """Device and precision of every stage (auto: CUDA with bf16 when a GPU is present, else CPU fp32)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The network."""
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """The tokenizer."""
    data: DataConfig
    """Pretraining sources."""
    eval: dict[str, list[SuiteEntry]] = Field(default_factory=dict)
    """Named evaluation suites: suite name -> entries. An entry is a local task or tag of eval/benchmarks/
    (`world_lookup`, `world`), or a standard lm-eval task on local files, `gsm8k@FOLDER` (a folder,
    relative to the current directory, with one JSONL or Parquet file per split the task reads;
    nothing is downloaded), run through the model's chat template as `chat:gsm8k@FOLDER`
    (eval/task_spec.py). The loader checks each against its task and files (recipe/checks.py)."""
    stages: StagesConfig = Field(default_factory=StagesConfig)
    """The stages to run, in pipeline order."""

    @model_validator(mode="after")
    def _tiers_as_weights(self) -> "Recipe":
        """Quality tiers become plain blend weights (what the loader reads). The checks that span
        blocks are the loader's (recipe/checks.py, engines/checks.py), run after validation."""
        if self.stages.pretrain is not None:
            self.stages.pretrain.phases = [p.with_tiers(self.data.sources) for p in self.stages.pretrain.phases]
        return self


# --------------------------------------------------------------------------- stages

STAGE_ORDER: tuple[str, ...] = tuple(StagesConfig.model_fields)
"""Every stage, in pipeline order: the fields of StagesConfig, where a stage's name is written once."""


def stage_blocks() -> dict[str, type]:
    """Stage name -> its recipe block's class (the type of its StagesConfig field)."""
    out = {}
    for name, field in StagesConfig.model_fields.items():
        (block,) = [t for t in typing.get_args(field.annotation) if t is not type(None)]
        out[name] = block
    return out


def engines_by_stage() -> dict[str, tuple[str, ...]]:
    """The engines each trainable stage can be given (each block's ENGINES; stages without an engine left out)."""
    return {name: block.ENGINES for name, block in stage_blocks().items() if hasattr(block, "ENGINES")}


def available_stages() -> list[str]:
    """Stages this version can run: every StagesConfig block, in pipeline order."""
    return list(STAGE_ORDER)


def select_stages(recipe: Recipe, names: str | typing.Sequence[str] | None) -> list[str] | None:
    """`--stages a,b` checked against the recipe, returned in pipeline order (None: all present)."""
    if names is None:
        return None
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    problems = []
    for n in wanted:
        if n not in STAGE_ORDER:
            problems.append(f"--stages: unknown stage {n!r}{did_you_mean(n, STAGE_ORDER)}")
        elif getattr(recipe.stages, n) is None:
            problems.append(f"--stages: the recipe has no stages.{n} block")
    if problems or not wanted:
        raise RecipeError(problems or ["--stages: name at least one stage"])
    return [s for s in STAGE_ORDER if s in wanted]
