"""The SFT flow's plain parts: where it starts, before/after deltas, evaluation reuse, finished sub-stages."""

from __future__ import annotations

import pytest

from stagewise.flows.sft import Scores, deltas
from stagewise.store.refs import CheckpointRef


def test_deltas_are_final_minus_base_for_scores_only():
    base = {"eval/world_chat_format/exact_match": 0.1, "eval/sft_heldout/loss": 3.5, "eval/sft_heldout/answered": 80.0,
            "eval/sft_heldout/supervised_tokens": 8000.0, "eval/only_base/x": 1.0}
    final = {"eval/world_chat_format/exact_match": 0.25, "eval/sft_heldout/loss": 1.5, "eval/sft_heldout/answered": 80.0,
             "eval/sft_heldout/supervised_tokens": 8000.0}
    assert deltas(base, final) == pytest.approx({"sft/world_chat_format/exact_match_delta": 0.15,
                                                 "sft/sft_heldout/loss_delta": -2.0})


class FakeTracker:
    def __init__(self):
        self.logged = []

    def log_metrics(self, run_id, records):
        self.logged += [(run_id, *r) for r in records]


def test_scores_evaluate_each_weights_once_and_copy_to_other_runs(monkeypatch):
    calls = []

    def fake_heldout(ref, path, pack_size, limit, tracker, run_id, device, switch):
        calls.append(("heldout", ref.path, run_id))
        tracker.log_metrics(run_id, [(ref.step, ref.tokens_seen, {"eval/sft_heldout/loss": 2.0})])
        return {"eval/sft_heldout/loss": 2.0}

    def fake_suite(ref, tasks, limit, tracker, run_id, device):
        calls.append(("suite", tuple(tasks), limit))
        tracker.log_metrics(run_id, [(ref.step, ref.tokens_seen, {"eval/t/exact_match": 0.5})])
        return {"eval/t/exact_match": 0.5}

    monkeypatch.setattr("stagewise.flows.sft.heldout_task", fake_heldout)
    monkeypatch.setattr("stagewise.flows.sft.suite_task", fake_suite)
    tracker = FakeTracker()
    scores = Scores(tracker, "/heldout.jsonl", 40, 512)
    ckpt = CheckpointRef(path="/ck/sub/step-00000010", step=10, tokens_seen=40960, sha256="abc")
    assert scores(ckpt, ["t"], 8, "sub-run") == {"eval/sft_heldout/loss": 2.0, "eval/t/exact_match": 0.5}
    # the stage run scores the same weights after the sub-stage: a copy at its own step, no new evaluation
    same_weights = ckpt.model_copy(update={"path": "/elsewhere"})
    assert scores(same_weights, ["t"], 8, "stage-run", at=(25, 90000))["eval/t/exact_match"] == 0.5
    assert [c[0] for c in calls] == ["heldout", "suite"]
    assert ("stage-run", 25, 90000, {"eval/t/exact_match": 0.5}) in tracker.logged
    scores(same_weights, ["t"], 20, "stage-run")  # another limit is another evaluation
    assert calls[-1] == ("suite", ("t",), 20)
    no_heldout = Scores(FakeTracker(), None, 40, 512)
    assert no_heldout(ckpt, None, None, "r") == {}

