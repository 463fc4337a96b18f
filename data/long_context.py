"""Batches for long-context continued pretraining: a token budget per step, filled with
sequences of mixed lengths from a blend of sources, documents kept whole.

    blend = long_context_blend(cfg, phase2_blend=last_pretrain_phase.blend)
    batches = LongContextBatches({name: TokenShard.open(path), ...}, cfg, blend, seed)
    batch = batches.next_batch()   # LongContextBatch: micro_batches [n, L + 1], tokens

Rules (ALGORITHMS.md §3; the exact allocation is ours):
- Lengths by tokens: every step spends exactly `global_batch_tokens` input tokens. Sequences
  per length: target_L = carry_L + share_L · budget tokens, n_L = ⌊target_L / L⌋, then the
  tokens left are filled one sequence at a time with the length (that fits) furthest below
  its target; carry_L = target_L − n_L · L goes to the next step. The config makes every
  length a multiple of the shortest and the budget a multiple of it, so the fill is exact,
  and each length's realised token share stays within one sequence of its target.
- Sources by tokens, the same way: sequences are handed out longest first, each to the
  source furthest below its token target (carry_s + w_s · budget), ties by name.
- Contents (a row holds L + 1 tokens, as in data/loader.py): a source reads its train
  shard's documents in order (wrapping = one more epoch) and keeps `lookahead_docs` of them
  in view. A row is filled best-fit with *whole* documents from that view (the largest that
  fits, earliest on ties), so a long row is one real long document or a concatenation of
  whole ones, never padding. A document is cut only when it is itself longer than the row
  (longer than every length of the mix first): it fills the rest of the row and the
  remainder stays in view as a piece. When nothing in view fits the room left and nothing
  is longer than the row, the row ends with the first tokens of the earliest document in
  view, which stays in view whole for a later row: those `filler_tokens` are a repeated
  prefix, never a lost part of a document (counted in `realized()`; ~1% or less with a
  varied view).
- Micro-batches hold one length each (max(1, micro_batch_tokens // L) rows), longest first;
  rows are shuffled within a length by a generator seeded with (seed, step).
Everything depends only on (seed, step) and the state, so `state_dict()` resumes exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from stagewise.data.long_context_config import DocQAConfig, LongContextDataConfig
from stagewise.data.shards import SourceShards, TokenShard, write_source_shards
from stagewise.data.world.doc_qa import doc_qa_texts

STATE_VERSION = 1
DOC_QA = "doc_qa"


@dataclass
class LongContextBatch:
    """One optimizer step: micro-batches of equal-length rows, and the step's input tokens."""

    micro_batches: list[torch.Tensor]
    """[rows, L + 1] LongTensors (inputs = [:, :-1], labels = [:, 1:]), one length each, longest first."""
    tokens: int
    """Σ rows · L over the micro-batches: exactly global_batch_tokens. Normalise the loss by it."""

    @property
    def lengths(self) -> list[int]:
        return [mb.shape[1] - 1 for mb in self.micro_batches]

    # The three calls model.trainer.Trainer makes on a global batch: the micro-batches are
    # already formed (one length each, sized by micro_batch_tokens), so `split` hands them
    # over as they are, and the LM objective's denominator (sum of rows x length) is the
    # step's token count: the loss is normalised by tokens, not by sequences.
    def to(self, device, non_blocking: bool = False) -> "LongContextBatch":
        return LongContextBatch([mb.to(device, non_blocking=non_blocking) for mb in self.micro_batches], self.tokens)

    def split(self, size: int) -> tuple[torch.Tensor, ...]:
        return tuple(self.micro_batches)

    @property
    def device(self) -> torch.device:
        return self.micro_batches[0].device


def long_context_blend(cfg: LongContextDataConfig, phase2_blend: dict[str, float] | None = None) -> dict[str, float]:
    """Source weights: doc_qa_share to `doc_qa`, retrieval_share to the retrieval source, the
    rest over the phase-2 blend (cfg.phase2_blend, else the one given), normalised to sum to 1."""
    phase2 = cfg.phase2_blend if cfg.phase2_blend is not None else phase2_blend
    rest = 1.0 - cfg.doc_qa_share - cfg.retrieval_share
    if rest > 0 and not phase2:
        raise ValueError("long_context: no phase-2 blend to downscale (set phase2_blend)")
    out: dict[str, float] = {}
    parts = [({DOC_QA: 1.0}, cfg.doc_qa_share), ({cfg.retrieval_source: 1.0}, cfg.retrieval_share), (phase2 or {}, rest)]
    for weights, share in parts:
        total = sum(weights.values())
        for name, w in weights.items():
            if share > 0 and w > 0:
                out[name] = out.get(name, 0.0) + share * w / total
    return dict(sorted(out.items()))


def prepare_doc_qa(tokenizer, out_dir: Path, cfg: DocQAConfig, seed: int, validation_fraction: float = 0.02) -> SourceShards:
    """Generate the document-QA texts and write them as train/val shards (data/shards.py)."""
    texts = doc_qa_texts(cfg.documents, seed, cfg.entities, cfg.min_paragraphs, cfg.max_paragraphs)
    return write_source_shards(texts, tokenizer, Path(out_dir), validation_fraction, seed, name=DOC_QA)


# --------------------------------------------------------------------------- allocation


def length_counts(shares: dict[int, float], budget: int, carry: dict[int, float]) -> tuple[dict[int, int], dict[int, float]]:
    """Sequences per length filling `budget` tokens exactly, and the carried token remainders."""
    target = {n: carry.get(n, 0.0) + shares[n] * budget for n in sorted(shares)}
    count = {n: max(0, math.floor(target[n] / n)) for n in target}
    while sum(n * c for n, c in count.items()) > budget:  # clipped negative carries can overshoot
        n = min((n for n in count if count[n]), key=lambda n: target[n] - count[n] * n)
        count[n] -= 1
    left = budget - sum(n * c for n, c in count.items())
    while left > 0:
        n = max((n for n in target if n <= left), key=lambda n: target[n] - count[n] * n)
        count[n] += 1
        left -= n
    return count, {n: target[n] - count[n] * n for n in target}


def assign_sources(seq_lengths: list[int], weights: dict[str, float], budget: int,
                   carry: dict[str, float]) -> tuple[list[str], dict[str, float]]:
    """A source per sequence (given longest first), each to the source furthest below its token target."""
    names = sorted(weights)
    due = {s: carry.get(s, 0.0) + weights[s] * budget for s in names}
    out = []
    for n in seq_lengths:
        s = max(names, key=lambda s: due[s])  # max() keeps the first (name order) on ties
        due[s] -= n
        out.append(s)
    return out, due


# --------------------------------------------------------------------------- one source


@dataclass
class _Stream:
    """A source's documents in shard order, with `view` of them kept in sight (see the module docstring)."""

    shard: TokenShard
    view_size: int
    cursor: int = 0
    epoch: int = 0
    view: list[list[int]] = field(default_factory=list)  # [document index, start offset]

    def _refill(self) -> None:
        while len(self.view) < self.view_size:
            self.view.append([self.cursor, 0])
            self.cursor += 1
            if self.cursor == self.shard.n_docs:
                self.cursor, self.epoch = 0, self.epoch + 1

    def _size(self, entry: list[int]) -> int:
        doc, start = entry
        return int(self.shard.doc_offsets[doc + 1] - self.shard.doc_offsets[doc]) - start

    def _tokens(self, entry: list[int], n: int) -> np.ndarray:
        doc, start = entry
        begin = int(self.shard.doc_offsets[doc]) + start
        return self.shard.tokens[begin: begin + n]

    def fill(self, width: int, longest: int) -> tuple[np.ndarray, int, int]:
        """A row of `width` tokens; returns (row, filler tokens, documents cut)."""
        room, pieces, filler, cuts = width, [], 0, 0
        while room > 0:
            self._refill()
            sizes = [self._size(e) for e in self.view]
            fits = [i for i, n in enumerate(sizes) if n <= room]
            if fits:
                i = max(fits, key=lambda i: (sizes[i], -i))
                pieces.append(self._tokens(self.view.pop(i), sizes[i]))
                room -= sizes[i]
                continue
            over = [i for i, n in enumerate(sizes) if n > width]
            if over:  # cut a document longer than the row; the rest stays in view
                i = min(over, key=lambda i: (sizes[i] <= longest, i))
                pieces.append(self._tokens(self.view[i], room))
                self.view[i][1] += room
                cuts += 1
            else:  # repeat the earliest document's prefix; it stays in view, whole
                pieces.append(self._tokens(self.view[0], room))
                filler += room
            room = 0
        return np.concatenate(pieces).astype(np.int64), filler, cuts


# --------------------------------------------------------------------------- the batches


class LongContextBatches:
    """Deterministic, resumable long-context batches over token shards (see the module docstring)."""

    def __init__(self, shards: dict[str, TokenShard], cfg: LongContextDataConfig, blend: dict[str, float], seed: int):
        weights = {s: w for s, w in blend.items() if w > 0}
        missing = sorted(set(weights) - set(shards))
        if not weights or missing:
            raise ValueError(f"long_context blend names sources with no shard: {missing}; shards: {sorted(shards)}"
                             if missing else "long_context blend has no positive weight")
        empty = sorted(s for s in weights if shards[s].n_docs == 0)
        if empty:
            raise ValueError(f"long_context sources with no documents: {empty}")
        total = sum(weights.values())
        self.cfg, self.seed = cfg, seed
        self.weights = {s: w / total for s, w in sorted(weights.items())}
        total_share = sum(x.share for x in cfg.lengths)
        self.shares = {x.length: x.share / total_share for x in cfg.lengths}
        self.longest = max(self.shares) + 1
        self.streams = {s: _Stream(shards[s], cfg.lookahead_docs) for s in self.weights}
        self.step = 0
        self.length_carry: dict[int, float] = {}
        self.source_carry: dict[str, float] = {}
        self._realized = {"sources": dict.fromkeys(self.weights, 0), "lengths": dict.fromkeys(sorted(self.shares), 0),
                          "filler_tokens": 0, "cut_documents": 0}

    def next_batch(self) -> LongContextBatch:
        """The next step's micro-batches (exactly global_batch_tokens input tokens)."""
        budget = self.cfg.global_batch_tokens
        counts, self.length_carry = length_counts(self.shares, budget, self.length_carry)
        seqs = [n for n in sorted(counts, reverse=True) for _ in range(counts[n])]
        owners, self.source_carry = assign_sources(seqs, self.weights, budget, self.source_carry)
        rows: dict[int, list[np.ndarray]] = {}
        for n, name in zip(seqs, owners):
            row, filler, cuts = self.streams[name].fill(n + 1, self.longest)
            rows.setdefault(n, []).append(row)
            self._count(name, n, filler, cuts)
        rng = np.random.default_rng([self.seed % 2**63, self.step])
        micro = []
        for n in sorted(rows, reverse=True):
            stacked = np.stack(rows[n])[rng.permutation(len(rows[n]))]
            per = max(1, self.cfg.micro_batch_tokens // n)
            micro += [torch.from_numpy(stacked[i: i + per]) for i in range(0, len(stacked), per)]
        self.step += 1
        return LongContextBatch(micro, budget)

    def _count(self, name: str, n: int, filler: int, cuts: int) -> None:
        r = self._realized
        r["sources"][name] += n
        r["lengths"][n] += n
        r["filler_tokens"] += filler
        r["cut_documents"] += cuts

    def realized(self) -> dict:
        """Input tokens served per source and per length, filler tokens and cut documents so far."""
        r = self._realized
        return {"sources": dict(r["sources"]), "lengths": dict(r["lengths"]),
                "filler_tokens": r["filler_tokens"], "cut_documents": r["cut_documents"]}

    def epochs(self) -> dict[str, float]:
        """Passes over each source's documents so far (a cursor position counts as a fraction)."""
        return {s: st.epoch + st.cursor / st.shard.n_docs for s, st in self.streams.items()}

    def _fingerprint(self) -> str:
        """What a saved state must match: seed, config, blend and each shard's size."""
        doc = {"seed": self.seed, "cfg": self.cfg.model_dump(mode="json"), "weights": self.weights,
               "shards": {s: [st.shard.n_docs, st.shard.n_tokens] for s, st in self.streams.items()}}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def state_dict(self) -> dict:
        """JSON-able position: step, carries, each source's cursor, epoch and view, realised counts."""
        return {
            "version": STATE_VERSION, "fingerprint": self._fingerprint(), "step": self.step,
            "length_carry": {str(n): c for n, c in self.length_carry.items()}, "source_carry": dict(self.source_carry),
            "streams": {s: {"cursor": st.cursor, "epoch": st.epoch, "view": [list(e) for e in st.view]}
                        for s, st in self.streams.items()},
            "realized": self.realized(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state_dict()` was taken (same shards, config, blend and seed)."""
        for key, mine in (("version", STATE_VERSION), ("fingerprint", self._fingerprint())):
            if state.get(key) != mine:
                raise ValueError(f"cannot resume: long-context loader state has {key}={state.get(key)!r}, this loader {mine!r} "
                                 "(different data, config, blend or seed)")
        self.step = int(state["step"])
        self.length_carry = {int(n): float(c) for n, c in state["length_carry"].items()}
        self.source_carry = {s: float(c) for s, c in state["source_carry"].items()}
        for s, st in state["streams"].items():
            stream = self.streams[s]
            stream.cursor, stream.epoch, stream.view = int(st["cursor"]), int(st["epoch"]), [list(map(int, e)) for e in st["view"]]
        r = state["realized"]
        self._realized = {"sources": dict(r["sources"]), "lengths": {int(n): t for n, t in r["lengths"].items()},
                          "filler_tokens": int(r["filler_tokens"]), "cut_documents": int(r["cut_documents"])}
