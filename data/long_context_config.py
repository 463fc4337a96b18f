"""Configs of the long-context data: the sequence-length mix, the source blend, document QA.

Nemotron 3 Nano's long-context phase (ALGORITHMS.md §3): 20% document QA, 1% synthetic
retrieval, 79% downscaled phase-2 data, sequences mixed long and short (512k with 4k) at a
constant learning rate. Shares are shares of *tokens*: a step is a token budget filled with
sequences of several lengths, so one long sequence weighs as much as many short ones.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig


class LengthShare(StrictConfig):
    """One sequence length of the mix and its share of the tokens."""

    length: int = Field(gt=1)
    """Tokens per sequence (each row holds length + 1 tokens: inputs and shifted labels)."""
    share: float = Field(gt=0)
    """Relative share of every step's tokens spent on sequences of this length (normalised over the mix)."""


class DocQAConfig(StrictConfig):
    """The demo world's document-QA texts (data/world/doc_qa.py)."""

    documents: int = Field(2000, ge=1)
    """How many documents to generate."""
    entities: int = Field(3000, ge=1)
    """Entity pool size; equal to the world's `facts` count, the entities are those of facts.jsonl."""
    min_paragraphs: int = Field(8, ge=1)
    """Fewest entity paragraphs per document."""
    max_paragraphs: int = Field(64, ge=1)
    """Most entity paragraphs per document (a paragraph is ~60 tokens with a 4k BPE)."""

    @model_validator(mode="after")
    def _range(self) -> "DocQAConfig":
        if self.min_paragraphs > self.max_paragraphs:
            raise ValueError(f"min_paragraphs ({self.min_paragraphs}) must be <= max_paragraphs ({self.max_paragraphs})")
        return self


def _default_lengths() -> list[LengthShare]:
    return [LengthShare(length=2048, share=0.4), LengthShare(length=1024, share=0.4), LengthShare(length=256, share=0.2)]


class LongContextDataConfig(StrictConfig):
    """Batches for long-context continued pretraining (data/long_context.py)."""

    lengths: list[LengthShare] = Field(default_factory=_default_lengths, min_length=1)
    """The sequence-length mix by token share, e.g. 80% at 4-8x the base length, 20% at the base length."""
    global_batch_tokens: int = Field(16384, gt=0)
    """Tokens per optimizer step (inputs; filled exactly with sequences of the mix's lengths)."""
    micro_batch_tokens: int = Field(4096, gt=0)
    """Tokens per forward/backward: a micro-batch of length L holds max(1, micro_batch_tokens // L) sequences."""
    doc_qa_share: float = Field(0.20, ge=0, le=1)
    """Share of tokens from document QA (source `doc_qa`)."""
    retrieval_share: float = Field(0.01, ge=0, le=1)
    """Share of tokens from synthetic key-value retrieval (source `retrieval_source`)."""
    retrieval_source: str = "retrieval"
    """Source name of the retrieval documents (the world's retrieval.jsonl)."""
    phase2_blend: dict[str, float] | None = None
    """The rest of the tokens, over these weights; None takes the pretraining's last phase blend."""
    lookahead_docs: int = Field(64, ge=1)
    """Documents a source keeps in view to fill a sequence with whole documents (best fit)."""
    doc_qa: DocQAConfig = Field(default_factory=DocQAConfig)
    """The generated document-QA texts."""

    @model_validator(mode="after")
    def _geometry(self) -> "LongContextDataConfig":
        lengths = [x.length for x in self.lengths]
        if len(set(lengths)) != len(lengths):
            raise ValueError(f"lengths must be distinct, got {lengths}")
        base = min(lengths)
        odd = [n for n in lengths if n % base]
        if odd:
            raise ValueError(f"every length must be a multiple of the shortest ({base}); got {odd}")
        if self.global_batch_tokens % base or self.global_batch_tokens < max(lengths):
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be a multiple of the shortest "
                             f"length ({base}) and at least the longest ({max(lengths)}), so every step fills exactly")
        if self.doc_qa_share + self.retrieval_share > 1:
            raise ValueError("doc_qa_share + retrieval_share must be <= 1")
        if self.phase2_blend is not None and (any(v < 0 for v in self.phase2_blend.values())
                                              or sum(self.phase2_blend.values()) <= 0):
            raise ValueError("phase2_blend weights must be >= 0 and not all zero")
        return self
