"""A small corpus with planted duplicates and rejects, and the tokenizer it is built with.

`Corpus.expected` is what the build must keep, worked out here from what was planted (never from
the build's own code): every document in plan order (sources in recipe order, files sorted, lines in
order) minus the planted rejects, every later copy of a text seen before (equal after case folding
and whitespace collapsing), and then every near duplicate as SFT curation's streaming check finds
them over the whole remaining list at once (data/curate/dedup.py `near_duplicates`, the reference
the build's sharded shuffle must agree with).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagewise.data.config import SourceConfig
from stagewise.data.curate.dedup import near_duplicates
from stagewise.data.tokenizer import train_bpe

COLORS = ["red", "green", "blue", "amber", "violet", "grey", "white"]
ANIMALS = ["fox", "heron", "otter", "lynx", "badger", "crane", "newt", "stoat"]
CITIES = ["Lyon", "Porto", "Turku", "Gdansk", "Aarhus", "Ghent", "Bergen", "Split", "Cork"]


def long_doc(i: int) -> str:
    """A long document (12 sentences): a copy with one word changed is a near duplicate (Jaccard ~0.9)."""
    return " ".join(doc(i * 1000 + k).replace("\n", " ") for k in range(12))


def doc(i: int) -> str:
    """A distinct, clean document (passes every default filter)."""
    return (f"Record {i}: the {COLORS[i % 7]} {ANIMALS[i % 8]} walked {i * 3 + 1} miles to {CITIES[i % 9]}.\n"
            f"It rested near the river for {i % 11 + 2} days before going on.")


REJECTS = {"hi there": "too_short", "#### $$$$ %%%% ^^^^ &&&& @@@@ ok": "symbol_heavy",
           "same line\nsame line\nsame line\nsame line\nanother line": "repeated_lines"}


@dataclass
class Corpus:
    base: Path
    sources: list[SourceConfig]
    expected: dict[str, list[str]]
    """Per source, the texts kept, in plan order."""
    docs: dict[str, int]
    rejected: dict[str, dict[str, int]]
    duplicates: dict[str, dict[str, int]]
    after_exact: dict[str, list[str]]
    """Per source, the texts left after the filters and exact dedup (what near dedup is given), in plan order."""


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def write_corpus(base: Path) -> Corpus:
    """web/: four JSONL files (blank lines, rejects, an exact and a re-spaced upper-case copy); books.parquet:
    three row groups, one document a copy of a web one."""
    web = base / "web"
    web.mkdir(parents=True)
    files: list[list[str]] = [[doc(f * 100 + i) for i in range(40)] for f in range(4)]
    files[2][10] = files[0][5]                               # exact copy, another file
    files[3][20] = "  " + files[1][7].upper().replace(" ", "   ")  # same text after normalising
    files[1][30], files[2][31], files[3][32] = REJECTS       # one of each reject reason
    files[0][12], files[1][12] = long_doc(1), long_doc(2)
    files[3][12] = long_doc(1).replace("rested", "slept", 1)  # near copies: one word changed, other files
    near_books = long_doc(2).replace("river", "lake", 1)
    for f, texts in enumerate(files):
        lines = []
        for i, t in enumerate(texts):
            lines.append(json.dumps({"text": t, "id": i}))
            if i % 13 == 0:
                lines.append("")                             # blank lines are skipped, not documents
        (web / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")
    books = [doc(1000 + i) for i in range(60)]
    books[45] = files[1][3]                                  # a copy of a web document: web comes first
    books[50] = near_books
    table = pa.table({"text": books})
    pq.write_table(table, base / "books.parquet", row_group_size=20)
    sources = [SourceConfig(name="web", path="web"), SourceConfig(name="books", path="books.parquet")]
    seen, dups, after_exact = set(), {}, []
    for name, texts in (("web", [t for f in files for t in f]), ("books", books)):
        dups[name] = {"exact": 0, "near": 0}
        for t in texts:
            if t in REJECTS:
                continue
            if _norm(t) in seen:
                dups[name]["exact"] += 1
                continue
            seen.add(_norm(t))
            after_exact.append((name, t))
    near = near_duplicates([t for _, t in after_exact], threshold=0.8)
    expected = {"web": [], "books": []}
    for i, (name, t) in enumerate(after_exact):
        if i in near:
            dups[name]["near"] += 1
        else:
            expected[name].append(t)
    rejected = {"web": {reason: 1 for reason in REJECTS.values()}, "books": {}}
    left = {"web": [t for name, t in after_exact if name == "web"], "books": [t for name, t in after_exact if name == "books"]}
    return Corpus(base, sources, expected, {"web": 160, "books": 60}, rejected, dups, left)


@pytest.fixture(scope="session")
def corpus_tokenizer(tmp_path_factory) -> Path:
    """A 500-token byte-level BPE (eos id 2), saved as an HF directory."""
    path = tmp_path_factory.mktemp("corpus_tok")
    train_bpe([doc(i) for i in range(300)], 500).save_pretrained(path)
    return path


@pytest.fixture
def corpus(tmp_path) -> Corpus:
    return write_corpus(tmp_path / "in")
