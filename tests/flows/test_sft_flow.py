"""The SFT flow's plain parts: where it starts, before/after deltas, evaluation reuse, finished sub-stages."""

from __future__ import annotations

import pytest

from stagewise.flows.sft import Scores, deltas
from stagewise.refs import CheckpointRef


def test_deltas_are_final_minus_base_for_scores_only():
    base = {"eval/world_chat_format/exact_match": 0.1, "eval/sft_test/loss": 3.5, "eval/sft_test/answered": 80.0,
            "eval/sft_test/supervised_tokens": 8000.0, "eval/only_base/x": 1.0}
    final = {"eval/world_chat_format/exact_match": 0.25, "eval/sft_test/loss": 1.5, "eval/sft_test/answered": 80.0,
             "eval/sft_test/supervised_tokens": 8000.0}
    assert deltas(base, final) == pytest.approx({"sft/world_chat_format/exact_match_delta": 0.15,
                                                 "sft/sft_test/loss_delta": -2.0})


class FakeTracker:
    def __init__(self):
        self.logged = []

    def log_metrics(self, run_id, records):
        self.logged += [(run_id, *r) for r in records]


def test_scores_evaluate_each_weights_once_and_copy_to_other_runs(monkeypatch):
    from stagewise.eval.intervals import Scored

    calls = []

    def fake_heldout(ref, path, split, seed, pack_size, limit, tracker, run_id, device, switch, drop_reasoning):
        assert drop_reasoning is False  # the recipe keeps its traces
        calls.append(("heldout", split, ref.path, run_id))
        tracker.log_metrics(run_id, [(ref.step, ref.tokens_seen, {f"eval/sft_{split}/loss": 2.0})])
        return Scored({f"eval/sft_{split}/loss": 2.0}, {f"eval/sft_{split}/exact_match": {"c1": 1, "c2": 0}})

    def fake_suite(ref, tasks, limit, tracker, run_id, device):
        calls.append(("suite", tuple(tasks), limit))
        tracker.log_metrics(run_id, [(ref.step, ref.tokens_seen, {"eval/t/exact_match": 0.5})])
        return {"eval/t/exact_match": 0.5}

    monkeypatch.setattr("stagewise.flows.sft.heldout_task", fake_heldout)
    monkeypatch.setattr("stagewise.flows.sft.suite_task", fake_suite)
    tracker = FakeTracker()
    scores = Scores(tracker, "/heldout.jsonl", 40, 512, seed=7)
    ckpt = CheckpointRef(path="/ck/sub/step-00000010", step=10, tokens_seen=40960, sha256="abc")
    # a sub-stage's mark (its gate's evaluation) reads dev only
    assert scores(ckpt, ["t"], 8, "sub-run", splits=("dev",)) == {"eval/sft_dev/loss": 2.0, "eval/t/exact_match": 0.5}
    # the stage run scores the same weights after the sub-stage on both splits: dev is a copy at its own
    # step, test (not scored before) is the one new evaluation
    same_weights = ckpt.model_copy(update={"path": "/elsewhere"})
    both = scores(same_weights, ["t"], 8, "stage-run", at=(25, 90000))
    assert both == {"eval/sft_dev/loss": 2.0, "eval/sft_test/loss": 2.0, "eval/t/exact_match": 0.5}
    assert [c[:2] for c in calls] == [("heldout", "dev"), ("suite", ("t",)), ("heldout", "test")]
    assert ("stage-run", 25, 90000, {"eval/t/exact_match": 0.5}) in tracker.logged
    assert ("stage-run", 25, 90000, {"eval/sft_dev/loss": 2.0}) in tracker.logged
    scores(same_weights, ["t"], 20, "stage-run")  # another limit is another evaluation
    assert calls[-1] == ("suite", ("t",), 20)
    # each conversation's result, by weights, for the closing table's interval (a copy adds nothing new)
    assert scores.items == {"abc": {"eval/sft_dev/exact_match": {"c1": 1, "c2": 0},
                                    "eval/sft_test/exact_match": {"c1": 1, "c2": 0}}}
    no_heldout = Scores(FakeTracker(), None, 40, 512, seed=7)
    assert no_heldout(ckpt, None, None, "r") == {}



def test_the_closing_table_row_says_what_each_substage_gate_decided():
    from stagewise.flows.sft import gate_note

    held = {"action": "stop", "held": True, "tokens_seen": 614_400, "reason": "rule held at step 300: ..."}
    assert gate_note("stage1", held, 983_040) == "stage1 gate: stop at 614,400 of 983,040 tokens (rule held)"
    budget = {"action": "stop", "held": False, "tokens_seen": 983_040,
              "reason": "budget exhausted at 983040 tokens, rule not held (eval/sft_dev/exact_match = 0.3 >= 0.5)"}
    assert gate_note("s", budget, 983_040).endswith("(budget exhausted, rule not held)")
    plateau = {"action": "stop", "held": False, "tokens_seen": 10, "reason": "plateau: eval/sft_dev/loss has not ..."}
    assert gate_note("s", plateau, 20).endswith("(plateau)")
