"""MinHash-LSH: Jaccard estimates, planted near duplicates found at the threshold, distinct kept."""

from __future__ import annotations

import random

import numpy as np
import pytest

from stagewise.data.curate.dedup import ExactDedup, NearDedup, near_duplicates
from stagewise.data.curate.minhash import LSHIndex, MinHasher, candidate_probability, jaccard_estimate, optimal_bands, shingle_hashes
from stagewise.data.curate.structural import Rejected

WORDS = [f"w{i}" for i in range(5000)]


def text(rng: random.Random, n: int = 200) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def with_jaccard(base: set[str], target: float, rng: random.Random) -> set[str]:
    """A set of the same size whose Jaccard with `base` is ~target (replace k elements)."""
    n = len(base)
    k = round(n * (1 - target) / (1 + target))  # |A & B| = n - k, |A | B| = n + k
    keep = rng.sample(sorted(base), n - k)
    return set(keep) | {f"new{rng.random()}" for _ in range(k)}


def sig_of(items: set[str], hasher: MinHasher) -> np.ndarray:
    return hasher.signature(shingle_hashes(sorted(items), 1))


@pytest.mark.parametrize("target", [0.2, 0.5, 0.8, 0.95])
def test_jaccard_estimate_is_close(target):
    rng = random.Random(0)
    hasher = MinHasher(256, seed=1)
    a = {f"s{i}" for i in range(400)}
    b = with_jaccard(a, target, rng)
    true = len(a & b) / len(a | b)
    assert abs(jaccard_estimate(sig_of(a, hasher), sig_of(b, hasher)) - true) < 0.08  # ~3 sigma at P=256


def test_signatures_are_deterministic_and_batched_equal_single():
    rng = random.Random(1)
    sets = [shingle_hashes(text(rng, n).split(), 5) for n in (1, 3, 50, 400)] + [np.zeros(0, dtype=np.uint64)]
    h1, h2 = MinHasher(64, seed=7), MinHasher(64, seed=7)
    batch = h1.signatures(sets, block=100)
    for s, row in zip(sets, batch):
        assert np.array_equal(h2.signature(s), row)
    assert not np.array_equal(MinHasher(64, seed=8).signature(sets[2]), batch[2])


def test_optimal_bands_gives_an_s_curve_at_the_threshold():
    b = optimal_bands(0.8, 128)
    r = 128 // b
    assert candidate_probability(np.array(0.5), b, r) < 0.05
    assert candidate_probability(np.array(0.95), b, r) > 0.99
    assert 0.6 < (1 / b) ** (1 / r) < 0.9


def test_lsh_index_candidates_share_a_band():
    idx = LSHIndex(8, bands=4)
    a = np.arange(8, dtype=np.uint32)
    idx.insert(1, a)
    b = a.copy()
    b[[0, 2, 4]] = 99  # bands (0,1), (2,3), (4,5) differ; (6,7) equal
    assert idx.candidates(b) == {1}
    b[6] = 99
    assert idx.candidates(b) == set()


def test_planted_near_duplicates_found_and_distinct_kept():
    rng = random.Random(2)
    originals = [text(rng) for _ in range(150)]
    near = []
    for src in rng.sample(range(150), 30):
        toks = originals[src].split()
        for i in rng.sample(range(len(toks)), 2):  # 2 of 200 words: Jaccard of 5-shingles ~0.9
            toks[i] = "zzz"
        near.append((src, " ".join(toks)))
    far = []
    for src in rng.sample(range(150), 20):
        toks = originals[src].split()
        for i in rng.sample(range(len(toks)), 40):  # 40 of 200 words: Jaccard well below 0.8
            toks[i] = "yyy"
        far.append(" ".join(toks))
    texts = originals + [t for _, t in near] + far
    found = near_duplicates(texts, threshold=0.8)
    planted = {150 + i: src for i, (src, _) in enumerate(near)}
    assert found == planted  # every planted near copy, matched to its source, and nothing else


def test_threshold_is_the_verification_rule():
    rng = random.Random(3)
    a = text(rng, 300)
    toks = a.split()
    for i in rng.sample(range(300), 12):  # ~0.8 Jaccard on 5-shingles
        toks[i] = "qqq"
    b = " ".join(toks)
    strict, loose = NearDedup(0.97), NearDedup(0.5)
    for dedup in (strict, loose):
        dedup.add(0, dedup.check(a))
    strict.check(b)  # not a duplicate at 0.97
    with pytest.raises(Rejected) as e:
        loose.check(b)
    assert e.value.reason == "near_duplicate" and "line 0" in e.value.detail


def test_exact_dedup_normalises_text():
    d = ExactDedup()
    d.add(1, d.check("Hello   World\n"))
    with pytest.raises(Rejected) as e:
        d.check("hello world")
    assert e.value.reason == "exact_duplicate" and "line 1" in e.value.detail
    d.check("hello world!")
