"""Key-value retrieval documents: a list of records, then a question about one key and its answer.

These train (and later test) lookups over long contexts: most documents are short, a
fifth are long (hundreds of records), and the asked key sits anywhere in the list.
`make_retrieval` returns the structured record so long-context tasks can reuse it.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from stagewise.data.world._common import rng_for

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "iris",
         "juniper", "kelp", "lumen", "marble", "nectar", "onyx", "pepper", "quartz", "russet",
         "sable", "tundra", "umber", "velvet", "willow", "xenon", "yarrow", "zephyr"]


@dataclass(frozen=True)
class RetrievalDoc:
    """Records (key, value) in order, and the key that is asked about."""

    pairs: tuple[tuple[str, str], ...]
    key: str
    value: str


def _key(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=3)) + "-" + str(rng.randint(1000, 9999))


def make_retrieval(rng: random.Random, n_pairs: int) -> RetrievalDoc:
    """`n_pairs` records with unique keys; one of them is the question."""
    keys: dict[str, None] = {}
    while len(keys) < n_pairs:
        keys[_key(rng)] = None
    pairs = tuple((k, f"{rng.choice(WORDS)} {rng.randint(0, 999)}") for k in keys)
    key, value = pairs[rng.randrange(n_pairs)]
    return RetrievalDoc(pairs, key, value)


def n_pairs_for(rng: random.Random) -> int:
    """Mostly short documents (4-60 records), one in five long (100-600 records)."""
    return rng.randint(100, 600) if rng.random() < 0.2 else rng.randint(4, 60)


def render_retrieval(doc: RetrievalDoc) -> str:
    """The records, the question and the answer as one text."""
    lines = ["Records:", *(f"{k}: {v}" for k, v in doc.pairs)]
    return "\n".join([*lines, f"Question: what is the value of {doc.key}?", f"Answer: {doc.value}"])


def retrieval_texts(n: int, seed: int) -> list[str]:
    """`n` rendered retrieval documents of varied length."""
    rng = rng_for(seed, "retrieval")
    return [render_retrieval(make_retrieval(rng, n_pairs_for(rng))) for _ in range(n)]
