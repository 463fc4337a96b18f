"""Configs of the SFT data path: curation, packing, sources and the domain blend.

Kept apart from data/config.py (pretraining data) so the SFT stage's recipe block composes
only what it needs. Every field carries its docstring, which becomes its description in
the recipe's JSON schema.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig


class CurateConfig(StrictConfig):
    """Which conversations are kept: structure, repetition, duplicates and length (data/curate/)."""

    max_reject_rate: float = Field(0.5, ge=0, le=1)
    """Fail the source (CurationError) when more than this fraction of its lines is rejected."""
    repeat_ngram: int = Field(4, ge=1)
    """n of the n-grams (in words) the repetition filters count."""
    repeat_window: int = Field(100, ge=2)
    """Sliding window, in words, inside which one n-gram may not recur too often."""
    repeat_max_count: int = Field(6, ge=1)
    """Reject an assistant turn in which one n-gram occurs more than this many times within a window."""
    repeat_max_fraction: float = Field(0.5, gt=0, le=1)
    """Reject an assistant turn whose n-grams are repeats (occurrences beyond the first) above this fraction."""
    repeat_min_words: int = Field(32, ge=1)
    """The fraction filter only judges turns of at least this many words (short answers repeat legitimately)."""
    exact_dedup: bool = True
    """Drop conversations whose normalised text (NFKC, lower case, collapsed whitespace) was seen before."""
    near_dedup: bool = True
    """Drop near duplicates found by MinHash-LSH (the first occurrence is kept)."""
    jaccard_threshold: float = Field(0.8, gt=0, le=1)
    """Two conversations are near duplicates when their shingle-set Jaccard similarity is at least this."""
    shingle_size: int = Field(5, ge=1)
    """k of the word k-shingles MinHash compares."""
    num_perm: int = Field(128, ge=4)
    """MinHash permutations P (signature length)."""
    bands: int | None = Field(None, ge=1)
    """LSH bands b, each of r = P // b rows; default: the b dividing P minimising 0.1 x false
    positives + 0.9 x false negatives around the threshold (candidates are verified, so recall
    first): 16 x 8 at P = 128 and threshold 0.8."""
    minhash_seed: int = 1
    """Seed of the MinHash hash functions (same seed, same signatures)."""
    max_chars: int | None = Field(200_000, gt=0)
    """Reject conversations whose rendered text is longer than this many characters (None: no limit)."""
    max_tokens: int | None = Field(None, gt=0)
    """Reject conversations longer than this many tokens (needs a tokenizer; None: no limit)."""

    @model_validator(mode="after")
    def _bands_fit(self) -> "CurateConfig":
        if self.bands is not None and self.bands > self.num_perm:
            raise ValueError(f"bands ({self.bands}) must not exceed num_perm ({self.num_perm})")
        return self


class PackingConfig(StrictConfig):
    """How rendered conversations become fixed-size training rows (data/packing.py)."""

    pack_size: int = Field(4096, gt=0)
    """Tokens per pack (the training sequence length); longer conversations are dropped, never cut."""
    distinct_prompts: bool = True
    """Never put two conversations with the same prompt into one pack."""


class SFTDataSource(StrictConfig):
    """One source of conversations: OpenAI messages, or prompt/completion rows (data/sft_rows.py)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Name used in reports and rejects files."""
    path: str
    """A JSONL, parquet or Arrow file, or a directory as teams keep them: a Hugging Face Hub shard
    folder (`data/train-00000-of-00002.parquet`, `train.jsonl`, `test/...`) or a `datasets`
    save_to_disk directory (data/row_files.py); `@world/<name>.jsonl` for the demo world's."""
    split: str | None = None
    """Split of a directory source (Hub layout or a saved DatasetDict); default `train`."""
    messages_field: str = Field("messages", min_length=1)
    """Column holding the conversation as OpenAI messages (role, content, and as given
    reasoning_content and tool_calls, whose arguments may be a JSON string or a mapping)."""
    prompt_field: str | None = Field(None, min_length=1)
    """Column of the prompt, with completion_field: a string (one user turn) or a list of messages
    (TRL's conversational prompt-completion). Unset: a row without `messages_field` that has
    `prompt` and `completion` columns is converted the same way."""
    completion_field: str | None = Field(None, min_length=1)
    """Column of the completion, with prompt_field: a string (one assistant turn) or a list of messages."""
    domain: str | None = None
    """Domain the blend weighs this source under (default: its name)."""
    max_reject_rate: float | None = Field(None, ge=0, le=1)
    """Override of curate.max_reject_rate for this source (e.g. a knowingly dirty one)."""

    @model_validator(mode="after")
    def _prompt_completion(self) -> "SFTDataSource":
        if (self.prompt_field is None) != (self.completion_field is None):
            raise ValueError("prompt_field and completion_field go together: set both or neither")
        if self.prompt_field is not None and self.prompt_field == self.completion_field:
            raise ValueError(f"prompt_field and completion_field name the same column {self.prompt_field!r}")
        return self

    @property
    def domain_name(self) -> str:
        """The domain, defaulting to the source name."""
        return self.domain or self.name


class SFTBlend(StrictConfig):
    """Which conversations one SFT stage trains on (data/sft_blend.py)."""

    weights: dict[str, float]
    """Relative weight per domain (normalised to sum to 1)."""
    conversations: int | None = Field(None, gt=0)
    """Conversations to sample (default: the largest count the weights allow without repeating any domain)."""
    max_epochs: float = Field(1.0, gt=0)
    """Never draw a domain's conversations more than this many times over (the sample shrinks instead)."""
    reasoning_off_fraction: float = Field(0.0, ge=0, le=1)
    """Fraction of conversations (chosen by id, seeded) rendered with reasoning off: traces dropped, system marked."""

    @model_validator(mode="after")
    def _weights(self) -> "SFTBlend":
        bad = {k: v for k, v in self.weights.items() if v < 0}
        if bad:
            raise ValueError(f"blend weights must be >= 0, got {bad}")
        if sum(self.weights.values()) <= 0:
            raise ValueError("blend weights must not all be zero")
        return self


class SFTWorldConfig(StrictConfig):
    """The demo world's SFT conversations (data/world/conversations.py), made from the recipe's seed."""

    per_domain: int = Field(200, gt=0)
    """Conversations generated per domain (arithmetic, calculator, sorting, lookup, format)."""
    long_context: int = Field(50, ge=0)
    """Long retrieval conversations (100-600 records each; SFT stage 2)."""
    eval_fraction: float = Field(0.05, ge=0, lt=1)
    """Share of prompts held out (by prompt hash) into sft_eval.jsonl: never trained on."""
    entities: int | None = Field(None, gt=0)
    """Entities the `format` questions ask about; default the pretraining world's `facts` count
    (so the questions are about entities the base model read about), else 3000."""


class SFTDataConfig(StrictConfig):
    """Where an SFT stage's conversations come from and which of them it keeps."""

    world: SFTWorldConfig | None = None
    """Generate the demo world's conversations; sources name them as `@world/sft_<domain>.jsonl`."""
    sources: list[SFTDataSource] = Field(min_length=1)
    """Conversation files, each curated on its own, pooled by domain for the blends."""
    curate: CurateConfig = Field(default_factory=CurateConfig)
    """Curation thresholds (a source may override max_reject_rate)."""
    heldout: str | None = None
    """Held-out conversations (loss, greedy answers), split by prompt hash into dev and test
    (eval/splits.py): gates read dev at their marks, the base and the final checkpoint are scored on
    both, the closing table reports test. Default `@world/sft_eval.jsonl` when `world` is set, else none."""
    heldout_limit: int | None = Field(100, gt=0)
    """At most this many held-out conversations answered per split and evaluation (None: all)."""
    reasoning_content: Literal["keep", "drop"] = "keep"
    """What SFT does with an assistant turn's reasoning trace (`reasoning_content`, or `thinking` /
    `reasoning`): `keep` trains it, and a chat template that does not write traces (Llama 3.1's)
    stops the stage (exit 2) naming this field; `drop` discards every trace as the sources and the
    held-out conversations are read, so the final responses train alone, as the Nemotron recipe
    trains its reasoning-off samples."""
