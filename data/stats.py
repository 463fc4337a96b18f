"""Reference numbers for the prepared data that a trained model should beat.

A unigram model knows only how often each token occurs; its cross-entropy on the held-out
documents is the loss a language model reaches without using any context. A model whose
validation loss is not well below it has not learned anything beyond token frequencies.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from stagewise.data.shards import TokenShard


def token_counts(shards: Iterable[np.ndarray], vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
    """Occurrences of every id over the given token arrays (read in chunks, memmap friendly)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for tokens in shards:
        for start in range(0, len(tokens), chunk):
            counts += np.bincount(np.asarray(tokens[start: start + chunk]), minlength=vocab_size)[:vocab_size]
    return counts


def unigram_cross_entropy_of(train: Iterable[np.ndarray], val: Iterable[np.ndarray], vocab_size: int) -> float:
    """Nats/token on `val` of the add-one smoothed unigram fit to `train`: p(t) = (c_t + 1) / (N + V)."""
    counts = token_counts(train, vocab_size)
    logp = np.log(counts + 1.0) - np.log(counts.sum() + vocab_size)
    val_counts = token_counts(val, vocab_size)
    if val_counts.sum() == 0:
        raise ValueError("no validation tokens to score the unigram model on")
    return float(-(val_counts * logp).sum() / val_counts.sum())


def unigram_cross_entropy(prepared) -> float:
    """The unigram baseline over every source: trained on all train shards, scored on all val shards."""
    shards = [(TokenShard.open(s.train), TokenShard.open(s.val)) for s in prepared.sources.values()]
    vocab = prepared.vocab_size or shards[0][0].vocab_size
    return unigram_cross_entropy_of((t.tokens for t, _ in shards), (v.tokens for _, v in shards), vocab)
