"""Document QA in the demo world: deterministic, the answer is in the asked paragraph only,
and the existing world files do not change."""

from __future__ import annotations

import random

from stagewise.data.world.doc_qa import QUESTIONS, doc_qa_texts, make_doc_qa, render_doc_qa
from stagewise.data.world.facts import fact_texts, make_entities


def test_deterministic_from_the_seed():
    assert doc_qa_texts(5, 7, entities=50) == doc_qa_texts(5, 7, entities=50)
    assert doc_qa_texts(5, 7, entities=50) != doc_qa_texts(5, 8, entities=50)


def test_question_about_one_paragraph_with_its_answer():
    pool = make_entities(60, 0)
    rng = random.Random(0)
    for _ in range(20):
        doc = make_doc_qa(rng, pool, rng.randint(3, 10))
        text = render_doc_qa(doc, random.Random(1))
        body, qa = text.rsplit("\n\nQuestion: ", 1)
        paragraphs = body.split("\n\n")
        assert len(paragraphs) == len(doc.entities) and len(set(e.name for e in doc.entities)) == len(doc.entities)
        assert qa == f"{doc.question}\nAnswer: {doc.answer}"
        assert doc.entities[doc.asked].name in doc.question and doc.attribute in QUESTIONS
        if doc.attribute != "kind":  # "an observatory" renders the kind with its article
            assert doc.answer in paragraphs[doc.asked]


def test_paragraph_counts_stay_in_range():
    for text in doc_qa_texts(10, 0, entities=100, min_paragraphs=2, max_paragraphs=4):
        assert 2 <= len(text.split("\n\nQuestion:")[0].split("\n\n")) <= 4


def test_existing_world_generators_are_unchanged_by_it():
    before = fact_texts(30, 3)
    doc_qa_texts(5, 3, entities=30)
    assert fact_texts(30, 3) == before
