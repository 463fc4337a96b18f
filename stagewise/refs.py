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


class CuratedRef(BaseModel):
    """Curated sources: the kept conversations of each, their domains, and a digest of it all."""

    root: str
    digest: str
    files: dict[str, str]
    """Source name -> JSONL of the conversations it kept."""
    domains: dict[str, str]
    """Source name -> the domain the blends weigh it under."""


class PackedRef(BaseModel):
    """One sub-stage's training data: the packed rows, the sample behind them, and their report."""

    root: str
    rows: str
    sample: str
    """JSONL of the sampled conversations, each {"domain", "conversation"} (the next sub-stage's keep_previous)."""
    digest: str
    report: dict
    mixture: dict[str, float]


class StageSummary(BaseModel):
    """A stage's row in the closing table: what it set out to move, and by how much."""

    metric: str
    """The MLflow metric the stage targets and the closing table reports (e.g. `eval/validation/loss`,
    `rl/test/pass_at_1/all`: a held-out metric is its test split's, eval/splits.py)."""
    dev_metric: str | None = None
    """The same measure on the dev split, where the stage has one: what an ablation compares (test
    is for the report only). None: `metric` itself (a validation loss, a merge's score)."""
    before: float | None = None
    """Its value on the checkpoint the stage started from (None when there was none to score)."""
    after: float | None = None
    """Its value on the checkpoint the stage hands on."""
    higher_is_better: bool = False
    tokens: int = 0
    """Tokens the stage trained on (0 for stages that do not train, e.g. merging)."""
    seconds: float | None = None
    """Wall time of the stage in this pipeline run (filled by the pipeline)."""
    note: str | None = None
    """A short fact the row needs besides its metric (e.g. the quantize stage's effective bits)."""
    gain_low: float | None = None
    gain_high: float | None = None
    """The 95% interval of after - before: a paired bootstrap over the items both were scored on
    (eval/intervals.py); None where the metric is not scored per item (a loss) or nothing was before."""
    items: int | None = None
    """How many items (prompts, conversations) that interval is over."""
    tolerance: float | None = None
    """A drop the stage accepts as no change (quantization's `max_drop`): within it, `kept`."""
    verdict: str | None = None
    """What the interval supports: better, worse, kept, or not distinguishable (eval/intervals.py)."""


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
    summary: StageSummary | None = None
    """The stage's row in the closing table."""
    reused: bool = False
    """True when this run found the stage's step finished and trained nothing."""
    parent: str | None = None
    """The checkpoint the stage started from (its registry version links to that one's)."""
    trained_in_run: str | None = None
    """The MLflow run that trained it (a reused stage's curves live there, not in `run_id`)."""
