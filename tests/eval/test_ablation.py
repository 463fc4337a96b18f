"""eval/ablation.py: the comparison keeps scores, ranks variants on the target, renders a table."""

from __future__ import annotations

from stagewise.eval.ablation import compare, render_text, scores
from stagewise.eval.plots import ablation_plot

A = {"eval/h/exact_match": 0.2, "eval/h/loss": 1.5, "eval/h/answered": 100.0, "base/eval/h/exact_match": 0.0,
     "sft/h/exact_match_delta": 0.2, "eval/t/acc_stderr": 0.01, "eval/h/format_match": 0.5}
B = {"eval/h/exact_match": 0.3, "eval/h/loss": 1.4, "eval/h/answered": 90.0, "base/eval/h/exact_match": 0.0,
     "sft/h/exact_match_delta": 0.3, "eval/t/acc_stderr": 0.02, "eval/h/format_match": 0.5, "only/in_b": 1.0}


def test_scores_drop_base_deltas_counts_and_stderr():
    assert sorted(scores(A)) == ["eval/h/exact_match", "eval/h/format_match", "eval/h/loss"]


def test_compare_ranks_on_the_target_and_each_row_by_its_kind():
    table = compare({"a": A, "b": B}, target="eval/h/exact_match", higher_is_better=True)
    assert [r["metric"] for r in table["rows"]] == ["eval/h/exact_match", "eval/h/format_match", "eval/h/loss"]
    best = {r["metric"]: r["best"] for r in table["rows"]}
    assert best == {"eval/h/exact_match": "b", "eval/h/format_match": None, "eval/h/loss": "b"}
    assert table["winner"] == "b"
    flipped = compare({"a": A, "b": B}, target="eval/h/exact_match", higher_is_better=False)
    assert flipped["winner"] == "a"


def test_render_marks_the_best_and_names_the_winner():
    text = render_text(compare({"a": A, "b": B}, target="eval/h/exact_match", higher_is_better=True))
    row = next(line for line in text.splitlines() if line.startswith("eval/h/exact_match"))
    assert row.split()[1:] == ["0.2", "0.3*"]
    assert text.splitlines()[-1] == "best on eval/h/exact_match: b"


def test_plot_draws_differing_rows_and_says_how_many_were_equal():
    fig = ablation_plot(compare({"a": A, "b": B}, target="eval/h/exact_match", higher_is_better=True), "t")
    assert "best on eval/h/exact_match is b" in fig._suptitle.get_text()
    assert "1 metrics equal" in fig._suptitle.get_text()
    assert len(fig.axes) == 2  # rates, losses
