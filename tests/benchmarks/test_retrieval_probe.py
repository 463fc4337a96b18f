"""The retrieval probe runs end to end on a few steps and reports what its docstring promises."""

from __future__ import annotations

from tests.benchmarks.scripts import load_benchmark


def _probe():
    return load_benchmark("retrieval_probe")


def test_probe_reports_copy_ratio_and_needle_accuracy_per_evaluation(capsys):
    out = _probe().main(["--steps", "2", "--every", "1", "--prompts", "4", "--half", "8", "--seq", "64",
                         "--batch", "2", "--device", "cpu"])
    assert [r["step"] for r in out["copy"]] == [1, 2] and [r["step"] for r in out["needle"]] == [1, 2]
    for row in out["copy"]:
        assert row["ratio"] == row["second_half_loss"] / row["first_half_loss"] > 0
    for row in out["needle"]:
        assert 0 <= row["accuracy"] <= 1 and row["vs_chance"] == row["accuracy"] / 0.25
    assert capsys.readouterr().out.count('"task": "needle"') == 2  # one JSON line per evaluation


def test_retrieval_documents_answer_their_questions():
    import random

    doc = _probe().retrieval_doc(random.Random(0), questions=3)
    records = dict(line.split(": ", 1) for line in doc.split("\n")[1:] if not line.startswith(("Question", "Answer")))
    lines = doc.split("\n")
    asked = [(q.removeprefix("Question: what is the value of ").rstrip("?"), a.removeprefix("Answer: "))
             for q, a in zip(lines, lines[1:]) if q.startswith("Question")]
    assert len(asked) == 3 and all(records[k] == v for k, v in asked)
