"""The closing table: rows from stage results, the text a person reads, and the report's inputs."""

from __future__ import annotations

from stagewise.flows.closing_table import closing_rows, gate_decisions, loss_curves, render
from stagewise.store.refs import StageResult, StageSummary


def _results():
    pre = StageResult(stage="pretrain", checkpoint="/c/pre", run_id="r1", trained_in_run="r0", reused=True,
                      summary=StageSummary(metric="eval/validation/loss", before=8.3, after=2.99, tokens=1_474_560,
                                           seconds=410.2))
    merge = StageResult(stage="merge", checkpoint="/c/m", run_id="r2",
                        summary=StageSummary(metric="merge/handed_on_loss", before=2.96, after=2.96, seconds=35))
    sft = StageResult(stage="sft", checkpoint="/c/s", run_id="r3", gate={"action": "stop", "reason": "rule held",
                                                                          "tokens_seen": 8192, "step": 2},
                      summary=StageSummary(metric="eval/sft_heldout/exact_match", before=0.0, after=0.055,
                                           higher_is_better=True, tokens=90_000, seconds=140))
    bare = StageResult(stage="quantize", checkpoint="/c/q", run_id="r4")
    return [pre, merge, sft, bare]


def test_rows_have_every_column_and_empty_cells_for_a_stage_without_summary():
    rows = closing_rows(_results())
    assert [r["stage"] for r in rows] == ["pretrain", "merge", "sft", "quantize"]
    assert rows[0] == {"stage": "pretrain", "metric": "eval/validation/loss", "before": 8.3, "after": 2.99,
                            "higher_is_better": False, "tokens": 1_474_560, "seconds": 410.2, "run_id": "r1",
                            "reused": True, "note": None}
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
                    summary=StageSummary(metric="quant/heldout/exact_match", before=0.055, after=0.05,
                                         higher_is_better=True, note="5.92 effective bits"))
    line = render(closing_rows([q])).splitlines()[2]
    assert "0.055 -> 0.05  (worse)  [5.92 effective bits]" in line


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
