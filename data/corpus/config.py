"""How `stagewise data build` turns a recipe's sources into Megatron indexed shards (the recipe's `data.build`).

The build is one pipeline (read -> filter -> corpus-wide exact dedup -> tokenize -> write) run by
one of two executors: `in_process` (this process, one work unit after another) or `ray` (Ray
tasks on a local cluster the build starts and stops, or on an existing one at `ray.address`).
Both give byte-identical shards and manifests for the same inputs: nothing an executor decides
(worker count, timing, order of completion) reaches the output.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig


class RayConfig(StrictConfig):
    """Where and how wide the Ray executor runs."""

    address: str | None = None
    """An existing cluster (`auto`, or `host:port` of its head; its nodes must see the output directory and
    have stagewise installed); unset: a local cluster the build starts with `workers x cpus_per_worker`
    CPUs and stops when it ends."""
    workers: int = Field(2, ge=1)
    """Work units in flight at once."""
    cpus_per_worker: float = Field(1.0, gt=0)
    """CPUs Ray reserves per task; each task tokenizes with one thread, so 1 keeps tasks from
    fighting over cores."""
    no_progress_s: float = Field(600.0, gt=0)
    """Fail, naming the phase, when no work unit finishes for this long (a starved or lost cluster
    otherwise waits forever)."""


class FilterConfig(StrictConfig):
    """Heuristic document filters (data/corpus/filters.py); each rejects with its own reason."""

    min_words: int = Field(3, ge=0)
    """Reject `too_short`: fewer words (runs of word characters, or single marks)."""
    max_chars: int | None = Field(None, gt=0)
    """Reject `too_long`: more characters than this (unset: no limit)."""
    max_symbol_fraction: float = Field(0.5, gt=0, le=1)
    """Reject `symbol_heavy`: a larger fraction of non-space characters that are neither letters nor digits."""
    max_duplicate_line_fraction: float = Field(0.5, gt=0, le=1)
    """Reject `repeated_lines`: a larger fraction of a multi-line document's non-blank lines repeat an earlier line
    (Gopher's duplicate-line rule)."""


class CorpusDedupConfig(StrictConfig):
    """Corpus-wide duplicate removal: the first document of a group (in shard-plan order) is kept."""

    exact: bool = True
    """Drop a document whose normalised text (NFKC, lower case, whitespace collapsed) equals an earlier
    one's, across every source and file: a shuffle by a 128-bit hash of that text."""
    near: bool = True
    """Drop a document whose word-shingle set has Jaccard similarity >= `threshold` with an earlier kept one:
    MinHash signatures (rensa), LSH bands shuffled by band hash, every candidate pair verified by its exact
    Jaccard (the same rule as SFT curation's, data/curate/dedup.py)."""
    engine: Literal["builtin", "curator"] = "builtin"
    """Who finds near duplicates: `builtin`, the shuffle above, on any machine (byte-identical across executors);
    `curator`, NeMo Curator's GPU fuzzy dedup (FuzzyDeduplicationWorkflow: MinHash over `char_ngrams`-character
    shingles, LSH, connected components, one document kept per group, not necessarily the earliest), for corpora
    where the CPU shuffle is too slow. It needs a CUDA GPU and Curator's `deduplication_cuda12` extra (cuDF); the
    build refuses it up front without them, and `stagewise data build --dry-run` shows the calls it would make
    (data/corpus/curator.py). Exact dedup stays builtin either way."""
    threshold: float = Field(0.8, gt=0, le=1)
    """Jaccard similarity at or above which two documents are near duplicates."""
    shingle_size: int = Field(5, ge=1)
    """Words per shingle."""
    num_perm: int = Field(128, ge=4)
    """MinHash permutations P."""
    bands: int | None = Field(None, ge=1)
    """LSH bands b (r = P // b rows each); default: the b dividing P that best separates the threshold."""
    minhash_seed: int = 1
    """Seed of the MinHash permutations."""
    max_bucket: int = Field(1000, ge=2)
    """Documents of one LSH bucket compared pairwise at most; a larger bucket (thousands of near-identical
    boilerplate pages) compares each later member with its first `max_bucket` members only."""
    char_ngrams: int = Field(24, ge=1)
    """engine=curator only: characters per shingle (Curator's own unit; it warns below 20)."""
    partitions: int = Field(16, ge=1, le=4096)
    """Hash partitions of each shuffle (one reduce task each): larger for corpora whose hashes do not fit
    one task's memory (24 bytes a document for exact, 16 a band for near)."""

    @property
    def builtin_near(self) -> bool:
        """Near dedup by the builtin shuffle (the scan then records band hashes and shingle sets)."""
        return self.near and self.engine == "builtin"

    @property
    def curator_near(self) -> bool:
        return self.near and self.engine == "curator"

    @model_validator(mode="after")
    def _bands_fit(self) -> "CorpusDedupConfig":
        if self.bands is not None and self.bands > self.num_perm:
            raise ValueError(f"bands ({self.bands}) must not exceed num_perm ({self.num_perm})")
        return self


class CorpusBuildConfig(StrictConfig):
    """`stagewise data build`: shard plan, executor, filters and dedup."""

    executor: Literal["in_process", "ray"] = "in_process"
    """Run every work unit in this process, or as Ray tasks (see `ray`)."""
    ray: RayConfig = Field(default_factory=RayConfig)
    """The Ray executor's cluster and width."""
    shard_mb: float = Field(64.0, gt=0)
    """Target input size of a work unit (one output shard pair); JSONL files split at line boundaries,
    parquet at row groups, Arrow and txt files are whole units."""
    filters: FilterConfig = Field(default_factory=FilterConfig)
    """Heuristic filters."""
    dedup: CorpusDedupConfig = Field(default_factory=CorpusDedupConfig)
    """Corpus-wide dedup."""
