"""The closing table: rows from stage results, the text a person reads, and the report's inputs (the
token-axis loss and every stage's training signal, read from a real MLflow store)."""

from __future__ import annotations

import time

import pytest

from stagewise.eval.intervals import gain_fields
from stagewise.flows.closing_table import (
    DESCRIPTION_TAG,
    closing_rows,
    describe_parent_run,
    gate_decisions,
    log_closing_table,
    loss_curves,
    markdown_table,
    render,
    training_signals,
)
from stagewise.flows.sft import SUBSTAGE_TAG
from stagewise.refs import StageResult, StageSummary
from stagewise.store.tracking import STAGE_TAG, Tracker


def _results():
    pre = StageResult(stage="pretrain", checkpoint="/c/pre", run_id="r1", trained_in_run="r0", reused=True,
                      summary=StageSummary(metric="eval/validation/loss", before=8.3, after=2.99, tokens=1_474_560,
                                           seconds=410.2))
    merge = StageResult(stage="merge", checkpoint="/c/m", run_id="r2",
                        summary=StageSummary(metric="merge/handed_on_loss", before=2.96, after=2.96, seconds=35))
    sft = StageResult(stage="sft", checkpoint="/c/s", run_id="r3", gate={"action": "stop", "reason": "rule held",
                                                                          "tokens_seen": 8192, "step": 2},
                      summary=StageSummary(metric="eval/sft_test/exact_match", before=0.0, after=0.055,
                                           higher_is_better=True, tokens=90_000, seconds=140))
    bare = StageResult(stage="quantize", checkpoint="/c/q", run_id="r4")
    return [pre, merge, sft, bare]


def test_rows_have_every_column_and_empty_cells_for_a_stage_without_summary():
    rows = closing_rows(_results())
    assert [r["stage"] for r in rows] == ["pretrain", "merge", "sft", "quantize"]
    assert rows[0] == {"stage": "pretrain", "metric": "eval/validation/loss", "before": 8.3, "after": 2.99,
                            "higher_is_better": False, "tokens": 1_474_560, "seconds": 410.2, "run_id": "r1",
                            "reused": True, "note": None, "gain_low": None, "gain_high": None, "items": None,
                            "tolerance": None, "verdict": None, "review": None}
    assert rows[3]["metric"] is None and rows[3]["tokens"] == 0


def test_text_marks_direction_reuse_and_aligns_columns():
    lines = render(closing_rows(_results())).splitlines()
    assert lines[0].split() == ["stage", "metric", "before", "->", "after", "tokens", "time", "MLflow", "run"]
    assert set(lines[1]) <= {"-", " "}
    pre, merge, sft, bare = lines[2:]
    assert pre.startswith("pretrain (reused)") and "8.3 -> 2.99  (better)" in pre and "1,474,560" in pre and "410 s" in pre
    assert "2.96 -> 2.96" in merge and "better" not in merge and "worse" not in merge
    assert "0 -> 0.055  (better)" in sft  # higher is better
    assert bare.split()[:4] == ["quantize", "-", "-", "->"]
    assert pre.index("r1") == lines[0].index("MLflow")  # the run id sits under its header


def test_a_rows_note_is_printed_after_its_change():
    q = StageResult(stage="quantize", checkpoint="/c/q", run_id="r5",
                    summary=StageSummary(metric="quant/test/exact_match", before=0.055, after=0.05,
                                         higher_is_better=True, note="5.92 effective bits"))
    line = render(closing_rows([q])).splitlines()[2]
    assert "0.055 -> 0.05  (worse)  [5.92 effective bits]" in line


def test_a_row_with_per_item_scores_shows_the_gain_its_interval_and_what_it_supports():
    """The verdict follows the interval, not the point change: +0.035 over items that mostly did not
    move is not distinguishable from zero; 9 of 20 items gained is better; a quantized model that
    lost one answer of 50 is kept within max_drop 0.1 (a resample holds that loss 3 times or more with
    probability ~0.08, 4 or more ~0.02: the lower bound is -3/50)."""
    before = {f"p{i}": 0.0 for i in range(20)}
    one_up = before | {"p0": 0.7}  # one prompt's pass@1 0 -> 0.7: +0.035 on average
    nine_up = before | {f"p{i}": 1.0 for i in range(9)}
    lost_one = {f"q{i}": 1.0 for i in range(50)}
    rl = StageResult(stage="rl", checkpoint="/c/r", run_id="r6", summary=StageSummary(
        metric="rl/test/pass_at_1/all", before=0.0, after=0.035, higher_is_better=True,
        **gain_fields(before, one_up, True)))
    sft = StageResult(stage="sft", checkpoint="/c/s", run_id="r7", summary=StageSummary(
        metric="eval/sft_test/exact_match", before=0.0, after=0.45, higher_is_better=True,
        **gain_fields(before, nine_up, True)))
    quant = StageResult(stage="quantize", checkpoint="/c/q", run_id="r8", summary=StageSummary(
        metric="quant/test/exact_match", before=1.0, after=0.98, higher_is_better=True,
        **gain_fields(lost_one, lost_one | {"q3": 0.0}, True, tolerance=0.1)))
    rows = closing_rows([rl, sft, quant])
    assert [r["verdict"] for r in rows] == ["not distinguishable", "better", "kept"]
    # one nonzero difference of 0.7 in 20: a resample misses it with probability (19/20)^20 = 0.36,
    # so the lower bound is 0; the upper is 2 or 3 hits of 0.7 (0.07-0.105)
    assert rows[0]["gain_low"] == 0.0 and 0.07 <= rows[0]["gain_high"] <= 0.105 and rows[0]["items"] == 20
    assert rows[1]["gain_low"] > 0.2 and rows[1]["gain_high"] < 0.7
    assert rows[2]["gain_low"] == pytest.approx(-0.06) and rows[2]["gain_high"] == 0.0 and rows[2]["tolerance"] == 0.1
    lines = render(rows).splitlines()[2:]
    assert f"0 -> 0.035  +0.035 [+0, {rows[0]['gain_high']:+.3g}] (not distinguishable)" in lines[0]
    assert "(better)" in lines[1] and "0.45  +0.45 [" in lines[1]
    assert "1 -> 0.98  -0.02 [-0.06, +0] (kept)" in lines[2]


def test_the_markdown_table_has_the_texts_cells_and_links_each_run():
    """Prefect's artifact pages render Markdown: a table that wraps, each MLflow run id its run's link."""
    rows = closing_rows(_results())
    rows[2]["note"] = "stage1 gate: stop at 8,192 of 9,000 tokens (rule held) | a pipe"
    lines = markdown_table(rows, lambda run: f"http://m/#/runs/{run}").splitlines()
    assert lines[0] == "| stage | metric | before -> after | tokens | time | MLflow run |"
    assert lines[1] == "|---|---|---|---:|---:|---|"
    cells = [line.strip("|").strip().split(" | ") for line in lines[2:]]
    assert cells[0] == ["pretrain (reused)", "eval/validation/loss", "8.3 -> 2.99  (better)", "1,474,560", "410 s",
                        "[r1](http://m/#/runs/r1)"]
    assert r"(rule held) \| a pipe]" in lines[4]  # a cell's pipe cannot open a column
    assert len(lines) == 2 + len(rows)


class FakeTracker:
    def __init__(self):
        self.asked = []

    def metric_histories(self, run_id, names):
        self.asked.append(run_id)
        return {"train/lm_loss": [(1, 4096, 8.0), (2, 8192, 6.5)]}


def test_curves_come_from_the_run_that_trained_and_gates_from_the_results():
    tracker = FakeTracker()
    curves = loss_curves(tracker, _results())
    assert curves == {"pretrain": [(4096, 8.0), (8192, 6.5)]} and tracker.asked == ["r0"]
    assert gate_decisions(_results()) == [{"stage": "sft", "action": "stop", "reason": "rule held", "tokens_seen": 8192}]


# ---------------------------------------------------------------------- every stage's training signal, from MLflow

LOSS, TOTAL, ACC, MASKED, KL = "train/lm_loss", "rl/reward/total", "rl/reward/accuracy", "rl/is_masked_fraction", \
    "distill/reverse_kl"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A pipeline run on a real SQLite store: SFT with two trained sub-stages and a reused one, RL, distillation
    with a round and a teacher, and a later run that reused RL (its own run holds one re-logged point)."""
    root = tmp_path_factory.mktemp("mlflow")
    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", "exp", artifact_root=str(root / "artifacts"))
    parent = tracker.start_run("tiny", {})
    histories = {}

    def run(name: str, stage: str, under: str, metrics: dict[str, list[tuple[int, float]]], **tags: str) -> str:
        run_id = tracker.start_run(name, {STAGE_TAG: stage, **tags}, under)
        steps = sorted({s for points in metrics.values() for s, _ in points})
        tracker.log_metrics(run_id, [(s, 4096 * s, {m: v for m, points in metrics.items() for t, v in points if t == s})
                                     for s in steps])
        histories[name] = metrics
        time.sleep(0.01)  # distinct start times
        return run_id

    pre = run("pretrain", "pretrain", parent, {LOSS: [(1, 8.0), (2, 6.5)]})
    sft = run("sft", "sft", parent, {"eval/sft_dev/exact_match": [(0, 0.0)]})
    run("sft/general", "sft", sft, {LOSS: [(1, 3.0), (2, 2.6), (3, 2.4)], "train/lr": [(1, 1e-4)]},
        **{SUBSTAGE_TAG: "general"})
    run("sft/reasoning", "sft", sft, {LOSS: [(1, 2.5), (2, 2.45)]}, **{SUBSTAGE_TAG: "reasoning"})
    tracker.start_run("sft/math", {STAGE_TAG: "sft", SUBSTAGE_TAG: "math", "stagewise.reused": "true"}, sft)
    rl = run("rl", "rl", parent, {TOTAL: [(1, 0.2), (2, 0.35), (3, 0.5)], ACC: [(1, 0.1), (2, 0.3), (3, 0.4)],
                                  MASKED: [(1, 0.03), (2, 0.01), (3, 0.02)], "rl/clip_fraction": [(1, 0.1)]})
    distill = run("distill", "distill", parent, {"distill/recovered/math": [(1, 0.5)]})
    run("distill-teacher-math", "distill-teacher-math", distill, {KL: [(1, 9.9)], TOTAL: [(1, 0.9)]})
    run("distill/round-1", "distill", distill, {KL: [(1, 0.9), (2, 0.7), (3, 0.6)]})
    later = tracker.start_run("tiny", {})
    reused_rl = run("rl (reused)", "rl", later, {TOTAL: [(3, 0.55)]})  # as reused_result re-logs final metrics
    ids = {"pretrain": pre, "sft": sft, "rl": rl, "distill": distill, "reused_rl": reused_rl}
    return tracker, ids, histories


def _points(metric_points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(step, pytest.approx(value)) for step, value in metric_points]


def test_the_report_gets_each_stages_signal_from_mlflow(store):
    tracker, ids, histories = store
    results = [StageResult(stage=s, checkpoint=f"/c/{s}", run_id=ids[s]) for s in ("pretrain", "sft", "rl", "distill")]
    panels = {(p.stage, p.title): p for p in training_signals(tracker, results)}
    assert list(panels) == [("sft", "training loss per sub-stage"), ("rl", "reward (mean over rollouts)"),
                            ("rl", "tokens masked by importance sampling"),
                            ("distill", "reverse KL to the teachers per round")]  # pipeline order; pretrain: lm_curve
    sft = panels["sft", "training loss per sub-stage"]
    assert sft.metrics == (LOSS,)
    assert sft.lines == {"general": _points(histories["sft/general"][LOSS]),  # one line per trained sub-stage,
                         "reasoning": _points(histories["sft/reasoning"][LOSS])}  # the reused one has no history
    reward = panels["rl", "reward (mean over rollouts)"]
    assert reward.lines == {TOTAL: _points(histories["rl"][TOTAL]), ACC: _points(histories["rl"][ACC])}
    assert panels["rl", "tokens masked by importance sampling"].lines == {MASKED: _points(histories["rl"][MASKED])}
    kl = panels["distill", "reverse KL to the teachers per round"]
    assert kl.lines == {"round-1": _points(histories["distill/round-1"][KL])}  # not the teacher's RL run
    assert loss_curves(tracker, results) == {"pretrain": [(4096, 8.0), (8192, 6.5)]}


def test_a_stage_that_did_not_run_or_logged_nothing_has_no_panel(store):
    tracker, ids, _ = store
    only_sft = [StageResult(stage="sft", checkpoint="/c/s", run_id=ids["sft"]),
                StageResult(stage="merge", checkpoint="/c/m", run_id=ids["pretrain"])]  # merge declares nothing
    assert [p.stage for p in training_signals(tracker, only_sft)] == ["sft"]
    nothing_logged = StageResult(stage="rl", checkpoint="/c/r", run_id=ids["pretrain"])  # a run without rl/...
    assert training_signals(tracker, [nothing_logged]) == []


def test_a_reused_stage_contributes_nothing_of_its_own_run(store):
    """A reused stage's own run re-logs only its final metrics: its curves are the run that trained it,
    as for the token-axis loss (loss_curves); with no such run it has no panel."""
    tracker, ids, histories = store
    reused = StageResult(stage="rl", checkpoint="/c/r", run_id=ids["reused_rl"], reused=True, trained_in_run=ids["rl"])
    panels = training_signals(tracker, [reused])
    assert [p.lines for p in panels] == [{TOTAL: _points(histories["rl"][TOTAL]), ACC: _points(histories["rl"][ACC])},
                                         {MASKED: _points(histories["rl"][MASKED])}]
    gone = StageResult(stage="rl", checkpoint="/c/r", run_id=ids["reused_rl"], reused=True,
                       trained_in_run=ids["pretrain"])  # the run that trained it logged none of RL's signals
    assert training_signals(tracker, [gone]) == []


def test_nested_runs_are_listed_oldest_first_with_their_stage(store):
    tracker, ids, _ = store
    runs = tracker.nested_runs(ids["sft"])
    assert [(r.name, r.stage, r.tags.get(SUBSTAGE_TAG)) for r in runs] == [
        ("sft/general", "sft", "general"), ("sft/reasoning", "sft", "reasoning"), ("sft/math", "sft", "math")]
    assert tracker.nested_runs(ids["rl"]) == []


def test_the_closing_table_logs_a_report_with_every_stage_panel(store, tmp_path):
    tracker, ids, _ = store
    results = [StageResult(stage=s, checkpoint=f"/c/{s}", run_id=ids[s]) for s in ("pretrain", "sft", "rl", "distill")]
    pipeline = tracker.start_run("tiny (closing)", {})
    log_closing_table(tracker, pipeline, results, tmp_path)
    page = (tmp_path / "reports" / "pipeline_report.html").read_text(encoding="utf-8")
    for name in ("training loss across stages (pretrain;", "sft: training loss per sub-stage (train/lm_loss per step; "
                 "lines: general, reasoning)", "rl: reward (mean over rollouts)", "rl: tokens masked by importance",
                 "distill: reverse KL to the teachers per round (distill/reverse_kl per step; lines: round-1)"):
        assert f"<li>{name}" in page


def test_the_parent_run_reads_as_the_closing_table_in_mlflow(store):
    """Its description is the closing table (Markdown, runs linked); each stage's target is a metric of
    the parent, with its before and its gain's bounds where the row has them."""
    tracker, _, _ = store
    parent = tracker.start_run("tiny (described)", {})
    before = {f"p{i}": 0.0 for i in range(10)}
    rl = StageResult(stage="rl", checkpoint="/c/r", run_id="r9", summary=StageSummary(
        metric="rl/test/pass_at_1/all", before=0.0, after=0.5, higher_is_better=True,
        **gain_fields(before, before | {f"p{i}": 1.0 for i in range(5)}, True)))
    rows = closing_rows([*_results(), rl])
    describe_parent_run(tracker, parent, rows)
    tracker.flush(parent)
    run = tracker.client().get_run(parent)
    description = run.data.tags[DESCRIPTION_TAG]
    assert "| stage | metric | before -> after |" in description and "[r9](" in description
    assert "(better)" in description
    metrics = run.data.metrics
    assert metrics["pretrain/eval/validation/loss"] == pytest.approx(2.99)
    assert metrics["pretrain/eval/validation/loss_before"] == pytest.approx(8.3)
    assert metrics["rl/rl/test/pass_at_1/all"] == pytest.approx(0.5)
    assert metrics["rl/rl/test/pass_at_1/all_gain_low"] == pytest.approx(rows[-1]["gain_low"])
    assert metrics["rl/rl/test/pass_at_1/all_gain_high"] == pytest.approx(rows[-1]["gain_high"])
    assert "pretrain/eval/validation/loss_gain_low" not in metrics  # a loss has no per-item interval
    assert not any(k.startswith("quantize/") for k in metrics)  # no summary, no metric
