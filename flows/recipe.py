"""The recipe: one YAML file naming a model, its data and its stages.

This module holds the typed schema (composed from the libraries' own configs) and
the loader: `base:` inheritance, `--set a.b=v` overrides, validation in full before any
work starts, and errors that name the YAML path, file and line of the bad field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from data.config import DataConfig, PhaseConfig, TokenizerConfig, check_phases
from model.config import ModelConfig, TrainConfig


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


class TrackingConfig(_Config):
    """Where MLflow records go."""

    uri: str | None = None
    """MLflow tracking URI; default a SQLite store at <workdir>/mlflow.db."""
    experiment: str | None = None
    """MLflow experiment; default the recipe name."""


class PretrainStage(TrainConfig):
    """Phased pretraining: one LR schedule over the stage, blends switching at token fractions."""

    phases: list[PhaseConfig] = Field(min_length=1)
    """The curriculum: e.g. a diversity blend until 0.8, then a quality blend until 1.0."""
    val_tokens: int = Field(65536, gt=0)
    """Held-out tokens scored for the validation loss (per evaluation)."""


class StagesConfig(_Config):
    """One optional block per stage; a stage runs when its block is present."""

    pretrain: PretrainStage | None = None
    """Phased pretraining."""


class Recipe(_Config):
    """A whole training recipe."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Recipe name; also the MLflow experiment unless tracking.experiment is set."""
    seed: int = 1234
    """Seeds data generation, sampling, initialisation and dropout."""
    workdir: str = "runs/${name}"
    """Where data, checkpoints and the default MLflow store live (relative to the current directory)."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """MLflow settings."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The network."""
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """The tokenizer."""
    data: DataConfig
    """Pretraining sources."""
    eval: dict[str, list[str]] = Field(default_factory=dict)
    """Named evaluation suites: suite name -> task names."""
    stages: StagesConfig = Field(default_factory=StagesConfig)
    """The stages to run, in pipeline order."""

    @model_validator(mode="after")
    def _cross_checks(self) -> "Recipe":
        names = [s.name for s in self.data.sources]
        if self.stages.pretrain is not None:
            check_phases(self.stages.pretrain.phases, names)
        if self.tokenizer.train_sources:
            unknown = sorted(set(self.tokenizer.train_sources) - set(names))
            if unknown:
                raise ValueError(f"tokenizer.train_sources names unknown sources {unknown}")
        return self
