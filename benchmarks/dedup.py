"""Near-duplicate detection: ours (numpy shingling, rensa signatures, numpy banding) against
datasketch's MinHash + MinHashLSH and rensa's own RMinHash + RMinHashLSH.

    python benchmarks/dedup.py [--n 3000] [--json]        (datasketch: `pip install datasketch`)

Data: demo-world documents (encyclopedic paragraphs and key-value record lists), with 10%
planted near duplicates (a copy with a few words replaced) and the rest distinct. Every
side runs the same streaming rule: word 5-shingles of the normalised text (the curation's
`words`), 128 permutations, and a document is a duplicate when an indexed LSH candidate is
similar enough (>= 0.8), else it is indexed. Ours checks a candidate's exact shingle Jaccard
(what curation does); datasketch and rensa's own path check their MinHash estimate, as their
APIs give it. All band 16 x 8 (`optimal_bands`; rensa's LSH needs b to divide 128). Timed: the text to
the flags, shingling included, for each. Reported: documents/s of each and the ratios, how
well each one's flagged set agrees with ours (Jaccard of the two sets), and for each the
recall of the planted duplicates and the precision of its flags, both judged by the exact
shingle Jaccard (>= 0.8 counts as a duplicate).
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
RENSA_BANDS = 16  # rensa wants bands dividing the permutations: 16 x 8


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


def keep_first(minhashes, lsh) -> dict[int, int]:
    """The streaming rule over (index, MinHash) pairs in order, for a library's MinHash objects
    (`jaccard`) and LSH index (`query`, `insert`): a duplicate names the most similar kept one."""
    sigs, out = {}, {}
    for i, m in minhashes:
        hits = [(key, m.jaccard(sigs[key])) for key in lsh.query(m)]
        hits = [h for h in hits if h[1] >= THRESHOLD]
        if hits:
            out[i] = max(hits, key=lambda h: h[1])[0]
        else:
            sigs[i] = m
            lsh.insert(i, m)
    return out


def shingle_strings(text: str) -> list[str]:
    """The word 5-shingles of a text as strings (what a library hashing tokens itself is given)."""
    toks = words(normalise(text))
    k = min(SHINGLE, len(toks))
    return [" ".join(toks[j:j + k]) for j in range(len(toks) - k + 1)]


def datasketch_duplicates(texts: list[str], bands: int) -> dict[int, int]:
    """The same streaming rule with datasketch's MinHash (update_batch) and MinHashLSH."""
    from datasketch import MinHash, MinHashLSH

    def minhash(text: str) -> MinHash:
        m = MinHash(num_perm=NUM_PERM, seed=1)
        m.update_batch([s.encode() for s in shingle_strings(text)])
        return m

    lsh = MinHashLSH(num_perm=NUM_PERM, params=(bands, NUM_PERM // bands))
    return keep_first(((i, minhash(t)) for i, t in enumerate(texts)), lsh)


def rensa_duplicates(texts: list[str]) -> dict[int, int]:
    """The same streaming rule with rensa's own path: its token hashing, RMinHash and RMinHashLSH."""
    from rensa import RMinHash, RMinHashLSH

    lsh = RMinHashLSH(THRESHOLD, NUM_PERM, RENSA_BANDS)
    return keep_first(enumerate(RMinHash.from_token_sets([shingle_strings(t) for t in texts], NUM_PERM, 1)), lsh)


def timed(fn, *args) -> tuple[dict[int, int], float]:
    t0 = time.perf_counter()
    found = fn(*args)
    return found, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="documents (10%% of them planted near copies)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per side; the fastest counts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    texts, planted = corpus(args.n)
    bands = optimal_bands(THRESHOLD, NUM_PERM)
    sides = {"ours": lambda: near_duplicates(texts, THRESHOLD, NUM_PERM, bands, SHINGLE),
             "datasketch": lambda: datasketch_duplicates(texts, bands),
             "rensa_lsh": lambda: rensa_duplicates(texts)}
    out = {"documents": len(texts), "planted": len(planted), "bands": bands, "rows": NUM_PERM // bands}
    found = {}
    for name, fn in sides.items():
        try:
            runs = [timed(fn) for _ in range(args.repeat)]
        except ImportError as e:
            out[name] = None
            out.setdefault("skipped", []).append(f"{name}: {e} - no baseline")
            continue
        found[name] = runs[0][0]
        out[name] = {"docs_per_s": len(texts) / min(t for _, t in runs), **quality(found[name], texts, planted)}
        if name != "ours":
            a, b = set(found["ours"]), set(found[name])
            out[name]["agreement_with_ours"] = len(a & b) / len(a | b) if a | b else 1.0
            out[f"speed_ratio_ours_over_{name}"] = out["ours"]["docs_per_s"] / out[name]["docs_per_s"]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['documents']} documents, {out['planted']} planted near duplicates, b={bands} r={NUM_PERM // bands}")
    for name in sides:
        r = out.get(name)
        if r:
            agree = f"  agreement with ours {r['agreement_with_ours']:.3f}" if "agreement_with_ours" in r else ""
            print(f"{name:>10}: {r['docs_per_s']:>10,.0f} docs/s  flagged {r['flagged']}  "
                  f"planted recall {r['planted_recall']:.3f}  precision {r['precision']:.3f}{agree}")
    for name in sides:
        if f"speed_ratio_ours_over_{name}" in out:
            print(f"speed ours/{name} = {out[f'speed_ratio_ours_over_{name}']:.2f}x")
    for line in out.get("skipped", []):
        print(line)


if __name__ == "__main__":
    main()
