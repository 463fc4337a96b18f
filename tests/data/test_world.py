"""The demo world: deterministic from the seed, one file per kind, and its generators are right."""

import json
import random
import re

from stagewise.data.config import WorldConfig
from stagewise.data.world import generate_world, make_entities, make_problem, make_retrieval, noisy, render_entity
from stagewise.data.world.retrieval import render_retrieval
from stagewise.data.world.stdlib import MAX_SOURCE_CHARS, source_chunks, stdlib_files, stdlib_root

SMALL = WorldConfig(stdlib_files=3, facts=30, arithmetic=30, retrieval=8, noisy=20)
KINDS = ["stdlib", "facts", "arithmetic", "retrieval", "noisy"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_files_and_row_counts(tmp_path):
    paths = generate_world(SMALL, tmp_path, seed=7)
    assert sorted(paths) == sorted(KINDS)
    for kind, path in paths.items():
        assert path == tmp_path / f"{kind}.jsonl"
        rows = _rows(path)
        assert all(set(r) == {"text"} and r["text"].strip() for r in rows)
        expected = getattr(SMALL, "stdlib_files" if kind == "stdlib" else kind)
        assert len(rows) >= expected if kind == "stdlib" else len(rows) == expected


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = generate_world(SMALL, tmp_path / "a", seed=7)
    b = generate_world(SMALL, tmp_path / "b", seed=7)
    c = generate_world(SMALL, tmp_path / "c", seed=8)
    for kind in KINDS:
        assert a[kind].read_bytes() == b[kind].read_bytes(), kind
        assert a[kind].read_bytes() != c[kind].read_bytes(), kind


def test_entities_are_reusable_records():
    ents = make_entities(200, seed=3)
    assert ents == make_entities(200, seed=3)
    assert len({e.name for e in ents}) == 200
    e = ents[0]
    text = render_entity(e, random.Random(0))
    for value in (e.name, e.location, str(e.founded), f"{e.population:,}", e.colour, e.symbol, e.founder):
        assert value in text
    assert set(e.attributes()) == {"name", "kind", "founded", "location", "population", "colour", "symbol", "founder"}


def test_arithmetic_answers_and_working_are_correct():
    rng = random.Random(1)
    for _ in range(300):
        p = make_problem(rng)
        a, op, b = p.question.split()
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
        assert p.answer == expected
        if op == "x" and len(p.steps) > 1:
            assert p.steps[-1].endswith(f"= {abs(expected)}.")
        if op == "+":  # the written digits, most significant first, spell the answer
            written = [m.group(1) for s in p.steps if (m := re.search(r"write (\d)", s))]
            carry = re.search(r"final carry (\d)", p.steps[-1])
            assert int((carry.group(1) if carry else "") + "".join(reversed(written))) == expected


def test_retrieval_answer_is_the_asked_value():
    rng = random.Random(2)
    for n in (4, 50, 400):
        doc = make_retrieval(rng, n)
        assert len(doc.pairs) == n == len({k for k, _ in doc.pairs})
        assert dict(doc.pairs)[doc.key] == doc.value
        text = render_retrieval(doc)
        assert text.endswith(f"Question: what is the value of {doc.key}?\nAnswer: {doc.value}")


def test_noisy_damages():
    rng = random.Random(4)
    clean = render_entity(make_entities(1, seed=9)[0], rng)
    shuffled = noisy.shuffled_words(clean, rng)
    assert shuffled != clean and sorted(shuffled.split()) == sorted(clean.split())
    repeated = noisy.repeated_phrase(clean, rng)
    assert repeated.endswith(clean) and len(repeated) > len(clean)
    junk = noisy.char_junk(clean, rng)
    assert len(junk) > len(clean)
    assert any(line in noisy.BOILERPLATE for line in noisy.boilerplate(clean, rng).splitlines())
    texts = noisy.noisy_texts(40, seed=5)
    assert texts == noisy.noisy_texts(40, seed=5) and len(set(texts)) == 40


def test_stdlib_listing_is_sorted_and_skips_tests():
    root = stdlib_root()
    names = [f.relative_to(root).as_posix() for f in stdlib_files(root)]
    assert len(names) > 50 and names == sorted(names)
    assert not any(part in ("test", "tests", "idle_test") for n in names for part in n.split("/"))
    chunks = source_chunks("a = 1\n\n" + "def f():\n    return 1\n\n" * 400)
    assert len(chunks) > 1 and all(c.strip() for c in chunks)
    assert sum(len(c) for c in chunks) <= MAX_SOURCE_CHARS
