"""Configs owned by the data library: tokenizer, sources, the demo world and phase blends.

Paths that start with `@world/` point into the demo world that `stagewise data prepare`
generates under the recipe's workdir; other relative paths are resolved against the
directory of the recipe file that named them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.data.corpus.config import CorpusBuildConfig
from stagewise.data.reasoning_switch import SwitchSetting

WORLD_PREFIX = "@world/"



class TokenizerConfig(StrictConfig):
    """The tokenizer: an existing HF tokenizer directory, or a byte-level BPE trained on the sources."""

    path: str | None = None
    """An existing HF tokenizer directory; when unset a byte-level BPE is trained."""
    vocab_size: int = Field(4096, ge=300)
    """Vocabulary size of the trained BPE (special tokens included)."""
    train_sources: list[str] | None = None
    """Source names to train the BPE on (default: all sources)."""
    max_train_chars: int = Field(20_000_000, gt=0)
    """Stop feeding the trainer after this many characters (keeps prepare fast)."""
    reasoning_switch: SwitchSetting = "auto"
    """How the chat template turns reasoning off (data/reasoning_switch.py): `auto` detects it from the
    template (a `reasoning` or `enable_thinking` variable, else none); or {kind: kwarg, name, when_on,
    when_off}, {kind: system_flag, when_off, when_on} (e.g. when_off: /no_think, when_on: /think) or
    {kind: none}. Not a prepare input: it changes how chats are written, not how text is tokenized."""


WORLD_FACTS = 3000
"""The demo world's entity count when a recipe names none: the facts every later stage's world rows draw on."""


class WorldConfig(StrictConfig):
    """The demo world: text made on the spot, deterministically from the recipe's seed."""

    stdlib_files: int = Field(200, ge=0)
    """Python standard-library modules whose docstrings and source become documents."""
    facts: int = Field(WORLD_FACTS, ge=0)
    """Synthetic encyclopedic fact documents."""
    arithmetic: int = Field(3000, ge=0)
    """Arithmetic problems with worked steps."""
    retrieval: int = Field(500, ge=0)
    """Key-value retrieval documents (for long context)."""
    noisy: int = Field(2000, ge=0)
    """Low-quality variants (shuffled words, repetition, junk) so quality tiers mean something."""


class SourceConfig(StrictConfig):
    """One pretraining source."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Name used by blends, logs and metrics."""
    path: str
    """File, directory or glob (`web/part-*.jsonl`, `crawl/**/*.parquet`: the matches in sorted order, each read
    as `format` or as its suffix says) to read; `@world/<name>.jsonl` for the demo world; a URL of a JSONL or
    parquet file or glob (`s3://bucket/web/*.jsonl`), read through fsspec by `stagewise data build` only. A directory: txt files,
    or row files as teams keep them: a Hugging Face Hub shard folder (`data/train-00000-of-00002.parquet`,
    `train.jsonl`, `test/...`) or a `datasets` save_to_disk directory (data/row_files.py)."""
    format: Literal["jsonl", "parquet", "arrow", "txt"] | None = None
    """File format; inferred from the path's suffix. Unset for a directory: its jsonl, parquet and
    Arrow files (set it to read only one kind; `txt` for a directory of text files)."""
    split: str | None = None
    """Split of a directory of row files (Hub layout or a saved DatasetDict); default `train`."""
    text_field: str = Field("text", min_length=1)
    """Field (column) holding the text in jsonl, parquet and Arrow rows."""
    quality: Literal["high", "medium", "low"] = "medium"
    """Estimated quality tier: a phase's `quality_weights` weigh sources by it (see PhaseConfig)."""
    max_epochs: float = Field(4.0, gt=0)
    """Never read this source more than this many times over the whole run."""
    on_bad_line: Literal["error", "skip"] = "error"
    """A line that is not UTF-8, not JSON, not an object, or lacks a string text_field: `error`
    stops with the file and line (or row) (exit 2); `skip` drops it and counts it (data/sources.py)."""

    @model_validator(mode="after")
    def _infer_format(self) -> "SourceConfig":
        if self.format is None:
            suffix = Path(self.path).suffix.lstrip(".")
            if suffix in ("jsonl", "parquet", "arrow", "txt"):
                self.format = suffix  # type: ignore[assignment]
        if self.format == "txt" and self.split is not None:
            raise ValueError("split applies to row files (jsonl, parquet, Arrow), not txt")
        return self


class DataConfig(StrictConfig):
    """Where the pretraining text comes from and how it is split."""

    sources: list[SourceConfig] = Field(min_length=1)
    """The sources; names must be unique."""
    world: WorldConfig | None = None
    """Generate the demo world under the workdir (needed by `@world/` paths)."""
    validation_fraction: float = Field(0.02, ge=0, lt=0.5)
    """Fraction of each source's documents held out (by document hash) for validation loss."""
    build: CorpusBuildConfig = Field(default_factory=CorpusBuildConfig)
    """How `stagewise data build` writes the sources as Megatron indexed shards past one process (shard plan,
    in-process or Ray executor, filters, corpus-wide dedup). `data prepare` and the stages' own preparation
    do not read it: they tokenize in this process."""

    @model_validator(mode="after")
    def _unique(self) -> "DataConfig":
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate source names: {', '.join(dup)}")
        if self.world is None and any(s.path.startswith(WORLD_PREFIX) for s in self.sources):
            raise ValueError(f"sources use {WORLD_PREFIX} paths but no `world` block is set")
        return self


class PhaseConfig(StrictConfig):
    """One phase of a curriculum: a blend of sources until a fraction of the stage's tokens."""

    name: str
    """Phase name used in logs (e.g. diversity, quality)."""
    until: float = Field(1.0, gt=0, le=1)
    """The phase ends at this fraction of the stage's tokens (the last phase must end at 1.0)."""
    blend: dict[str, float] = Field(default_factory=dict)
    """Relative weight per source name (normalised to sum to 1)."""
    quality_weights: dict[Literal["high", "medium", "low"], float] = Field(default_factory=dict)
    """Relative weight per quality tier, for the sources `blend` does not name: each such source
    of a tier gets the tier's weight split evenly among them (e.g. {high: 3, medium: 1, low: 0}:
    a quality phase without listing every source). The recipe fills these into `blend`."""

    @model_validator(mode="after")
    def _weights(self) -> "PhaseConfig":
        bad = {k: v for k, v in (self.blend | self.quality_weights).items() if v < 0}
        if bad:
            raise ValueError(f"blend weights must be >= 0, got {bad}")
        if sum(self.blend.values()) + sum(self.quality_weights.values()) <= 0:
            raise ValueError("blend weights must not all be zero (give blend or quality_weights)")
        return self

    def with_tiers(self, sources: list["SourceConfig"]) -> "PhaseConfig":
        """This phase with `quality_weights` filled into `blend` for the sources it does not name."""
        if not self.quality_weights:
            return self
        blend = dict(self.blend)
        for tier, weight in self.quality_weights.items():
            members = [s.name for s in sources if s.quality == tier and s.name not in self.blend]
            blend |= {name: weight / len(members) for name in members}
        return self.model_copy(update={"blend": blend})


def check_phases(phases: list[PhaseConfig], source_names: list[str]) -> None:
    """Phases must be ordered, end at 1.0 and name only known sources (raises ValueError)."""
    ends = [p.until for p in phases]
    if ends != sorted(ends) or len(set(ends)) != len(ends):
        raise ValueError(f"phase `until` values must increase, got {ends}")
    if ends[-1] != 1.0:
        raise ValueError(f"the last phase must end at until: 1.0, got {ends[-1]}")
    for p in phases:
        unknown = sorted(set(p.blend) - set(source_names))
        if unknown:
            raise ValueError(f"phase {p.name!r} names unknown sources {unknown}; known: {sorted(source_names)}")
