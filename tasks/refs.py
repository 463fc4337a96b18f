"""Small references that Prefect tasks hand each other: paths and hashes, never tensors."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PreparedRef(BaseModel):
    """Prepared data: the content-hashed directory and its digest."""

    root: str
    digest: str


class CheckpointRef(BaseModel):
    """A saved checkpoint and where it stands in training."""

    path: str
    step: int
    tokens_seen: int
    sha256: str = ""


class StageResult(BaseModel):
    """What a stage flow returns and the next stage consumes (DESIGN.md, Stage result)."""

    stage: str
    checkpoint: str
    run_id: str
    gate: dict | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    data_root: str | None = None
    """The prepared pretraining data the stage saw (later stages score on its held-out shards)."""
    stage_dir: str | None = None
    """The stage's checkpoint directory (merging reads every checkpoint in it)."""
