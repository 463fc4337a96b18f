"""Document QA: a long document of entity paragraphs, then a question about one entity and its answer.

Why: long-context training needs documents whose end depends on their beginning. Here the
answer is written only in one paragraph, anywhere in the document, so predicting it needs
the whole context (the Nemotron 3 long-context phase gives 20% of its tokens to document
QA; ALGORITHMS.md §3). The entities are the world's own (`make_entities`, facts.py) and
each paragraph is `render_entity`, so the text matches facts.jsonl's style.

This generator draws from its own seeded RNG (`rng_for(seed, "doc_qa")`), so adding it
changes none of the existing world files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from stagewise.data.world._common import rng_for
from stagewise.data.world.facts import Entity, make_entities, render_entity

QUESTIONS: dict[str, tuple[str, str]] = {
    "founded": ("In which year was {name} founded?", "{founded}"),
    "founder": ("Who founded {name}?", "{founder}"),
    "location": ("In which region is {name}?", "{location}"),
    "population": ("What is the population of {name}?", "{population:,}"),
    "colour": ("What is the official colour of {name}?", "{colour}"),
    "symbol": ("What is the emblem of {name}?", "{symbol}"),
    "kind": ("What kind of place is {name}?", "{kind}"),
}
"""Attribute -> (question, answer) templates over Entity fields."""


@dataclass(frozen=True)
class DocQA:
    """Entities in paragraph order, the one asked about, and the question and answer."""

    entities: tuple[Entity, ...]
    asked: int
    """Index into `entities` of the paragraph holding the answer."""
    attribute: str
    question: str
    answer: str


def make_doc_qa(rng: random.Random, pool: list[Entity], n_paragraphs: int) -> DocQA:
    """`n_paragraphs` distinct entities from `pool`; a question about one of them."""
    entities = tuple(rng.sample(pool, min(n_paragraphs, len(pool))))
    asked = rng.randrange(len(entities))
    attribute = rng.choice(sorted(QUESTIONS))
    q, a = QUESTIONS[attribute]
    fields = entities[asked].attributes()
    return DocQA(entities, asked, attribute, q.format(**fields), a.format(**fields))


def render_doc_qa(doc: DocQA, rng: random.Random) -> str:
    """Paragraphs separated by blank lines, then "Question: ...\\nAnswer: ..."."""
    paragraphs = [render_entity(e, rng) for e in doc.entities]
    return "\n\n".join(paragraphs) + f"\n\nQuestion: {doc.question}\nAnswer: {doc.answer}"


def doc_qa_texts(n: int, seed: int, entities: int = 3000, min_paragraphs: int = 8,
                 max_paragraphs: int = 64) -> list[str]:
    """`n` rendered documents of min..max paragraphs over `make_entities(entities, seed)`.

    With `entities` equal to the world's `facts` count, the entities are those of facts.jsonl.
    """
    if not 1 <= min_paragraphs <= max_paragraphs:
        raise ValueError(f"need 1 <= min_paragraphs <= max_paragraphs, got {min_paragraphs}, {max_paragraphs}")
    rng = rng_for(seed, "doc_qa")
    pool = make_entities(max(entities, 1), seed)
    return [render_doc_qa(make_doc_qa(rng, pool, rng.randint(min_paragraphs, max_paragraphs)), rng) for _ in range(n)]
