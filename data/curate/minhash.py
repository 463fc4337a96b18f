"""MinHash signatures over word shingles, and LSH banding (Broder 1997; Leskovec et al., MMDS ch. 3).

Who does what, and why: the signatures are rensa's (a maintained Rust MinHash); turning texts
into shingle hashes and banding the signatures are ours, in numpy over a whole batch, because a
regex and a hash call per word in Python cost more than rensa's signatures themselves
(benchmarks/dedup.py measures the whole path against datasketch and rensa's own LSH).

- Words are the curation's rule (`text.words`: runs of word characters, or one mark that is
  neither word nor space, with Python's Unicode classes), found over the code points of the
  whole batch at once, on the folded text (`text.fold`: NFKC, lower case).
- A word hashes to a 64-bit polynomial of its code points (mod 2^64: prefix sums over a group of
  texts, so every word of the group is hashed in one pass), finalised by splitmix64's mixer; a k-shingle hashes to
  the fold h = (h + w) * c mod 2^64 over its k words (c odd); a text shorter than k is one
  shingle, an empty one has none. Deterministic across processes (no salted `hash`).
- Signatures: rensa's RMinHash over each document's shingle hashes, P seeded hash functions,
  uint32 per entry; Pr[sig_i(A) = sig_i(B)] ~ J(A, B): documents alike in Jaccard similarity
  are alike in signature. An empty document's entries are all 0xFFFFFFFF.
- LSH (for candidates; curate/dedup.py verifies them): the signature cut into b bands of r = P // b rows; two documents become candidates when
  any band is identical, with probability 1 - (1 - J^r)^b, an S-curve whose threshold is
  ~ (1/b)^(1/r). `optimal_bands` picks b minimising the integrated false-positive and
  false-negative probability around the configured threshold, weighted towards recall since
  candidates are verified.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import rensa

from stagewise.data.curate.text import fold

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: the shingle fold's multiplier
_P = 0x100000001B3  # the words' polynomial base (FNV's 64-bit prime)
_WORD, _SPACE, _MARK = 1, 0, 2


def _char_class(ch: str) -> int:
    """Python's `re` classes: \\w is alphanumeric or "_", \\s is `isspace`; anything else is a mark."""
    return _WORD if ch.isalnum() or ch == "_" else _SPACE if ch.isspace() else _MARK


_ASCII_CLASS = np.array([_char_class(chr(c)) for c in range(128)], dtype=np.uint8)


def _classes(cps: np.ndarray) -> np.ndarray:
    """Each code point's class; the non-ASCII ones are classified once per distinct code point."""
    low = cps < 128
    if low.all():
        return _ASCII_CLASS[cps]
    out = np.empty(len(cps), dtype=np.uint8)
    out[low] = _ASCII_CLASS[cps[low]]
    distinct, where = np.unique(cps[~low], return_inverse=True)
    out[~low] = np.array([_char_class(chr(c)) for c in distinct], dtype=np.uint8)[where]
    return out


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 .. base^(n-1) mod 2^64 (uint64 arrays wrap)."""
    out = np.ones(n, dtype=np.uint64)
    if n > 1:
        out[1:] = np.cumprod(np.full(n - 1, base, dtype=np.uint64))
    return out


def mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit reaches every output bit."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


CHUNK_CHARS = 1 << 22
"""Texts are hashed in groups of about this many characters (the power tables' largest size: 64 MiB)."""
_tables: dict[str, np.ndarray] = {"powers": np.ones(1, dtype=np.uint64), "inverses": np.ones(1, dtype=np.uint64)}


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P^i and P^-i mod 2^64 for i < n at least, kept for the process (grown by doubling, so a stream
    of small texts builds small tables and a batch builds its size once)."""
    if len(_tables["powers"]) < n:
        size = max(n, 2 * len(_tables["powers"]))
        _tables["powers"], _tables["inverses"] = _powers(_P, size), _powers(pow(_P, -1, 2**64), size)
    return _tables["powers"], _tables["inverses"]


def _group_word_hashes(folded: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every word of the folded texts; each text's word count)."""
    joined = "\n".join(folded) + "\n"  # a space after every text: no word crosses it, none is empty
    if joined.isascii():
        cps = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        cls = np.take(_ASCII_CLASS, cps)
    else:
        cps = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
        cls = _classes(cps)
    word, mark = cls == _WORD, cls == _MARK
    first = mark | (word & ~np.r_[False, word[:-1]])
    starts = np.flatnonzero(first)
    ends = np.flatnonzero(mark | (word & ~np.r_[word[1:], False])) + 1
    text_starts = np.cumsum([0] + [len(t) + 1 for t in folded[:-1]])
    counts = np.add.reduceat(first, text_starts, dtype=np.int64)
    # a word's hash: sum of its code points x P^(position in the word) = (H[end] - H[start]) x P^-start
    # with H the prefix sums of code point x P^(position in the group)
    powers, inverses = _power_tables(len(cps))
    prefix = np.zeros(len(cps) + 1, dtype=np.uint64)
    np.cumsum(cps.astype(np.uint64) * powers[:len(cps)], out=prefix[1:])
    sums = (prefix[ends] - prefix[starts]) * inverses[starts]
    return mix64(sums + (ends - starts).astype(np.uint64)), counts


def word_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every word of every folded text, uint64; per-text offsets into it, length n + 1)."""
    folded = [fold(t) for t in texts]
    hashes, counts, group, size = [], [], [], 0
    for text in [*folded, None]:
        if group and (text is None or size + len(text) + 1 > CHUNK_CHARS):
            h, c = _group_word_hashes(group)
            hashes.append(h)
            counts.append(c)
            group, size = [], 0
        if text is not None:
            group.append(text)
            size += len(text) + 1
    flat = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    per_text = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
    return flat, np.r_[0, np.cumsum(per_text)].astype(np.int64)


def _fold(words: np.ndarray) -> np.uint64:
    """The shingle hash of these words: h = (h + w) * c over them."""
    h = np.uint64(0)
    with np.errstate(over="ignore"):
        for w in words:
            h = (h + w) * _MIX
    return h


def shingles(texts: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every word k-shingle of every text, uint64; per-text offsets into it, length n + 1).

    Repeated shingles stay: a MinHash of a multiset is the MinHash of its set."""
    words, word_offsets = word_hashes(texts)
    n_words = np.diff(word_offsets)
    count = np.where(n_words >= k, n_words - k + 1, np.minimum(n_words, 1))  # short text: one shingle
    offsets = np.r_[0, np.cumsum(count)].astype(np.int64)
    windows = max(len(words) - k + 1, 0)
    h = np.zeros(windows, dtype=np.uint64)
    for j in range(k):  # every window of k consecutive words, across texts too
        h = (h + words[j:j + windows]) * _MIX
    text_of = np.repeat(np.arange(len(texts), dtype=np.int32), n_words)
    h = h[text_of[:windows] == text_of[k - 1:k - 1 + windows]]  # the windows inside one text
    short = np.flatnonzero((n_words > 0) & (n_words < k))
    if len(short):
        at = offsets[short] - np.arange(len(short))  # where each goes among the others' shingles
        h = np.insert(h, at, [_fold(words[word_offsets[i]:word_offsets[i + 1]]) for i in short])
    return h, offsets


def _digests(flat: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int) -> "rensa.RMinHashDigestMatrix":
    return rensa.RMinHash.digest_matrix_from_flat_token_hashes(flat, offsets.astype(np.uint64), num_perm, seed)


def _as_array(matrix: "rensa.RMinHashDigestMatrix", num_perm: int) -> np.ndarray:
    return np.array(matrix.to_rows(), dtype=np.uint32).reshape(matrix.len(), num_perm)


def digest_rows(flat: np.ndarray, offsets: np.ndarray, num_perm: int, seed: int,
                rows: np.ndarray | None = None) -> np.ndarray:
    """[len(rows), num_perm] uint32 MinHash signatures (rensa) of the given texts of a `shingles`
    batch (all of them when rows is None). Copying a signature out of rensa costs more than
    computing it, so a batch asks only for the rows it will compare."""
    if rows is not None:
        lengths = np.diff(offsets)[rows]
        new = np.r_[0, np.cumsum(lengths)].astype(np.int64)
        flat = flat[np.repeat(offsets[:-1][rows] - new[:-1], lengths) + np.arange(new[-1])]
        offsets = new
    return _as_array(_digests(flat, offsets, num_perm, seed), num_perm)


def colliding_rows(flat: np.ndarray, offsets: np.ndarray, num_perm: int, bands: int, seed: int) -> np.ndarray:
    """The texts of a `shingles` batch that share at least one LSH band with another text of it.

    Only these can be anything's candidate, so a batch's streaming dedup loops over them alone.
    When b divides P, rensa's LSH flags them without copying a signature out (its bands are ours:
    r = P / b consecutive entries); otherwise numpy compares the bands (`band_collisions`)."""
    matrix = _digests(flat, offsets, num_perm, seed)
    if num_perm % bands == 0:
        flags = np.asarray(rensa.RMinHashLSH(0.5, num_perm, bands).query_duplicate_flags_matrix_one_shot(matrix))
    else:
        flags = band_collisions(_as_array(matrix, num_perm), bands)
    return np.flatnonzero(flags)


def candidate_probability(j: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Pr[two documents of Jaccard j share at least one band]."""
    return 1.0 - (1.0 - j**rows) ** bands


def optimal_bands(threshold: float, num_perm: int, fp_weight: float = 0.1, fn_weight: float = 0.9) -> int:
    """The band count b (rows r = P / b, b dividing P) minimising fp_weight * FP area + fn_weight * FN area.

    Weighted towards recall: every candidate is verified by its exact Jaccard (curate/dedup.py), so an LSH
    false positive costs one comparison while a false negative keeps a duplicate. b divides P so
    that every permutation is in a band and rensa's LSH bands alike. At threshold 0.8, P = 128
    this gives b = 16, r = 8: candidate probability 0.947 at J = 0.8, 0.99988 at J = 0.9 and
    0.06 at J = 0.5. (Over all b it was 14 x 9, which leaves 2 permutations out and misses a
    pair at J = 0.9 once in 1,000: benchmarks/dedup.py's 300 planted pairs lost one to it.)"""
    lo, hi = np.linspace(0.0, threshold, 200), np.linspace(threshold, 1.0, 200)
    best, best_err = 1, float("inf")
    for b in (b for b in range(1, num_perm + 1) if num_perm % b == 0):
        r = num_perm // b
        fp = np.trapezoid(candidate_probability(lo, b, r), lo)
        fn = np.trapezoid(1.0 - candidate_probability(hi, b, r), hi)
        err = fp_weight * fp + fn_weight * fn
        if err < best_err:
            best, best_err = b, err
    return best


def band_collisions(sigs: np.ndarray, bands: int) -> np.ndarray:
    """bool[n]: the rows of a signature matrix that share at least one band with another row."""
    n, num_perm = sigs.shape
    rows = num_perm // bands
    out = np.zeros(n, dtype=bool)
    for i in range(bands):
        keys = np.ascontiguousarray(sigs[:, i * rows:(i + 1) * rows]).view(np.dtype((np.void, 4 * rows))).ravel()
        _, where, counts = np.unique(keys, return_inverse=True, return_counts=True)
        out |= counts[where] > 1
    return out


class LSHIndex:
    """b hash tables over r-row bands of a signature; keys are the caller's integers."""

    def __init__(self, num_perm: int, bands: int) -> None:
        self.bands, self.rows = bands, num_perm // bands
        self.tables: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]

    def band_keys(self, sigs: np.ndarray) -> list[list[bytes]]:
        """Each signature's b band keys (the bytes of its r entries per band), for a batch [n, P] at once."""
        r = self.rows
        cut = np.ascontiguousarray(sigs[:, :self.bands * r]).view(np.dtype((np.void, 4 * r)))
        return cut.reshape(len(sigs), self.bands).tolist()

    def candidates(self, keys: list[bytes]) -> set[int]:
        """Keys sharing at least one band with the signature whose band keys these are."""
        out: set[int] = set()
        for table, key in zip(self.tables, keys):
            out.update(table.get(key, ()))
        return out

    def insert(self, key: int, keys: list[bytes]) -> None:
        for table, band in zip(self.tables, keys):
            table.setdefault(band, []).append(key)
