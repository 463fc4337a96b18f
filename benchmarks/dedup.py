"""Near-duplicate detection: our numpy MinHash-LSH against datasketch's MinHashLSH.

    python benchmarks/dedup.py [--n 3000] [--json]        (needs `pip install datasketch`)

Data: demo-world documents (encyclopedic paragraphs and key-value record lists), with 10%
planted near duplicates (a copy with a few words replaced) and the rest distinct. Both
sides run the same streaming rule with the same parameters: word 5-shingles of the
normalised text, 128 permutations, the same (bands, rows), and a document is a duplicate
when an indexed candidate's estimated Jaccard is >= 0.8 (else it is indexed). Timed:
shingling + signatures + LSH query/insert + verification, for each side.
Reported: documents/s of each and their ratio, how well the flagged sets agree (Jaccard
of the two sets), and for each the recall of the planted duplicates and the precision of
its flags, both judged by the exact shingle Jaccard (>= 0.8 counts as a duplicate).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.data.curate.dedup import near_duplicates  # noqa: E402
from stagewise.data.curate.minhash import optimal_bands  # noqa: E402
from stagewise.data.curate.text import normalise, words  # noqa: E402
from stagewise.data.world.facts import make_entities, render_entity  # noqa: E402
from stagewise.data.world.retrieval import make_retrieval, render_retrieval  # noqa: E402

THRESHOLD, NUM_PERM, SHINGLE = 0.8, 128, 5


def corpus(n: int, seed: int = 0) -> tuple[list[str], dict[int, int]]:
    """n documents, ~10% of them near copies of an earlier long one; returns (texts, {copy: source})."""
    rng = random.Random(seed)
    base = n - n // 10
    texts = [render_entity(e, rng) for e in make_entities(base // 2, seed)]
    texts += [render_retrieval(make_retrieval(rng, rng.randint(20, 60))) for _ in range(base - len(texts))]
    long_docs = [i for i in range(base) if len(texts[i].split()) >= 100]
    planted = {}
    for _ in range(n - base):
        src = rng.choice(long_docs)
        toks = texts[src].split()
        for _ in range(rng.randint(1, 2)):  # one or two words replaced: true Jaccard ~0.9-0.97
            toks[rng.randrange(len(toks))] = rng.choice(["lorem", "ipsum", "quartz", "velvet"])
        planted[len(texts)] = src
        texts.append(" ".join(toks))
    return texts, planted


def exact_jaccard(a: str, b: str) -> float:
    """Jaccard similarity of the two texts' word 5-shingle sets (the quantity MinHash estimates)."""
    def shingles(t: str) -> set:
        w = words(normalise(t))
        k = min(SHINGLE, len(w))
        return {tuple(w[i:i + k]) for i in range(len(w) - k + 1)}
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def quality(found: dict[int, int], texts: list[str], planted: dict[int, int]) -> dict:
    """Recall of the planted duplicates and precision of the flags (by exact Jaccard >= threshold)."""
    true_planted = {i for i, src in planted.items() if exact_jaccard(texts[i], texts[src]) >= THRESHOLD}
    correct = sum(exact_jaccard(texts[i], texts[j]) >= THRESHOLD for i, j in found.items())
    return {"flagged": len(found), "planted_recall": len(true_planted & set(found)) / max(len(true_planted), 1),
            "precision": correct / max(len(found), 1)}


def datasketch_duplicates(texts: list[str], bands: int) -> dict[int, int]:
    """The same streaming rule with datasketch's MinHash (update_batch) and MinHashLSH."""
    from datasketch import MinHash, MinHashLSH

    rows = NUM_PERM // bands
    lsh = MinHashLSH(num_perm=NUM_PERM, params=(bands, rows))
    sigs, out = {}, {}
    for i, text in enumerate(texts):
        toks = words(normalise(text))
        k = min(SHINGLE, len(toks))
        m = MinHash(num_perm=NUM_PERM, seed=1)
        m.update_batch([" ".join(toks[j:j + k]).encode() for j in range(len(toks) - k + 1)])
        hits = [(key, m.jaccard(sigs[key])) for key in lsh.query(m)]
        hits = [h for h in hits if h[1] >= THRESHOLD]
        if hits:
            out[i] = max(hits, key=lambda h: h[1])[0]
        else:
            sigs[i] = m
            lsh.insert(i, m)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    texts, planted = corpus(args.n)
    bands = optimal_bands(THRESHOLD, NUM_PERM)
    t0 = time.perf_counter()
    ours = near_duplicates(texts, THRESHOLD, NUM_PERM, bands, SHINGLE)
    t_ours = time.perf_counter() - t0
    out = {"documents": len(texts), "planted": len(planted), "bands": bands, "rows": NUM_PERM // bands,
           "ours": {"docs_per_s": len(texts) / t_ours, **quality(ours, texts, planted)}}
    try:
        t0 = time.perf_counter()
        theirs = datasketch_duplicates(texts, bands)
        t_ds = time.perf_counter() - t0
    except ImportError:
        out["datasketch"] = None
        out["skipped"] = "datasketch is not installed (pip install datasketch) - no baseline"
    else:
        a, b = set(ours), set(theirs)
        out["datasketch"] = {"docs_per_s": len(texts) / t_ds, **quality(theirs, texts, planted)}
        out["speed_ratio_ours_over_datasketch"] = out["ours"]["docs_per_s"] / out["datasketch"]["docs_per_s"]
        out["agreement_jaccard"] = len(a & b) / len(a | b) if a | b else 1.0
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['documents']} documents, {out['planted']} planted near duplicates, b={bands} r={NUM_PERM // bands}")
    for name in ("ours", "datasketch"):
        r = out.get(name)
        if r:
            print(f"{name:>10}: {r['docs_per_s']:>10,.0f} docs/s  flagged {r['flagged']}  "
                  f"planted recall {r['planted_recall']:.3f}  precision {r['precision']:.3f}")
    if out.get("datasketch"):
        print(f"speed ours/datasketch = {out['speed_ratio_ours_over_datasketch']:.2f}x, "
              f"agreement (Jaccard of flagged sets) = {out['agreement_jaccard']:.3f}")
    else:
        print(out["skipped"])


if __name__ == "__main__":
    main()
