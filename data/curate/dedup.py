"""Duplicate removal: exact (normalised text hash) and near (MinHash-LSH, verified).

Both are streaming and keep the first occurrence: a later sample is rejected when it
duplicates one already kept. A near-duplicate candidate from the LSH buckets is only
rejected when its estimated Jaccard similarity (fraction of equal MinHash entries) with
a kept sample is at least the configured threshold, so bucket collisions between
dissimilar texts do not cost data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from stagewise.data.curate.minhash import LSHIndex, MinHasher, jaccard_estimate, optimal_bands, shingle_hashes
from stagewise.data.curate.structural import Rejected
from stagewise.data.curate.text import normalise, words


class ExactDedup:
    """Rejects `exact_duplicate` when the normalised text was seen before."""

    def __init__(self) -> None:
        self.seen: dict[bytes, int] = {}

    def check(self, text: str) -> bytes:
        """Raise Rejected for a duplicate; else the digest to `add` once the sample is kept."""
        digest = hashlib.sha1(normalise(text).encode("utf-8")).digest()
        if digest in self.seen:
            raise Rejected("exact_duplicate", f"same normalised text as line {self.seen[digest]}")
        return digest

    def add(self, key: int, digest: bytes) -> None:
        self.seen[digest] = key


class NearDedup:
    """MinHash-LSH over word shingles; rejects `near_duplicate` at estimated Jaccard >= threshold."""

    def __init__(self, threshold: float, num_perm: int = 128, bands: int | None = None,
                 shingle_size: int = 5, seed: int = 1) -> None:
        self.threshold, self.shingle_size = threshold, shingle_size
        self.hasher = MinHasher(num_perm, seed)
        self.bands = bands or optimal_bands(threshold, num_perm)
        self.index = LSHIndex(num_perm, self.bands)
        self.sigs: dict[int, np.ndarray] = {}

    def signature(self, text: str) -> np.ndarray:
        return self.hasher.signature(shingle_hashes(words(normalise(text)), self.shingle_size))

    def find(self, sig: np.ndarray) -> tuple[int, float] | None:
        """(key, similarity) of the most similar kept sample at or above the threshold, if any."""
        best = None
        for key in self.index.candidates(sig):
            sim = jaccard_estimate(sig, self.sigs[key])
            if sim >= self.threshold and (best is None or sim > best[1]):
                best = (key, sim)
        return best

    def check(self, text: str) -> np.ndarray:
        """Raise Rejected for a near duplicate of a kept sample; else the signature to `add`."""
        sig = self.signature(text)
        hit = self.find(sig)
        if hit is not None:
            raise Rejected("near_duplicate", f"estimated Jaccard {hit[1]:.2f} with line {hit[0]}")
        return sig

    def add(self, key: int, sig: np.ndarray) -> None:
        """Index a kept sample under `key`."""
        self.sigs[key] = sig
        self.index.insert(key, sig)


def near_duplicates(texts: Sequence[str], threshold: float, num_perm: int = 128, bands: int | None = None,
                    shingle_size: int = 5, seed: int = 1) -> dict[int, int]:
    """{index of a near duplicate: index of the earlier kept text it duplicates} over a list.

    The same rule as NearDedup.check in a loop, with the signatures computed in batches."""
    dedup = NearDedup(threshold, num_perm, bands, shingle_size, seed)
    shingles = [shingle_hashes(words(normalise(t)), shingle_size) for t in texts]
    out = {}
    for i, sig in enumerate(dedup.hasher.signatures(shingles)):
        hit = dedup.find(sig)
        if hit is not None:
            out[i] = hit[0]
        else:
            dedup.add(i, sig)
    return out
