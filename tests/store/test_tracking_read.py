"""Reading metrics back from MLflow: histories round-trip, stage runs, and a cutoff on a real store.

One SQLite store per module (creating one runs MLflow's migrations, seconds each).
"""

from __future__ import annotations

import time

import pytest

from stagewise.eval.cutoffs import run_cutoff
from stagewise.eval.gates import GateRule
from stagewise.store.tracking import STAGE_TAG, Tracker

ACC = "eval/world_arithmetic/exact_match"
LOSS = "train/lm_loss"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two pretrain runs (oldest first) and one sft run, logged with Tracker.log_metrics."""
    root = tmp_path_factory.mktemp("mlflow")
    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", "exp", artifact_root=str(root / "artifacts"))
    parent = tracker.start_run("tiny", {})
    runs = []
    for i, accs in enumerate([(0.0, 0.1, 0.35, 0.5), (0.0, 0.05, 0.1, 0.2)]):
        run = tracker.start_run("pretrain", {STAGE_TAG: "pretrain"}, parent)
        records = [(step, step * 4096, {LOSS: 5.0 - step / 100}) for step in range(0, 31, 5)]
        records += [(step, step * 4096, {ACC: acc}) for step, acc in zip((0, 10, 20, 30), accs)]
        tracker.log_metrics(run, records)
        tracker.end_run(run)
        runs.append(run)
        time.sleep(0.01)  # distinct start times
    sft = tracker.start_run("sft", {STAGE_TAG: "sft"}, parent)
    tracker.log_metrics(sft, [(0, 0, {ACC: 0.5})])
    return tracker, runs, sft


def test_metric_histories_round_trip_with_tokens(store):
    tracker, (run, _), _ = store
    hist = tracker.metric_histories(run)
    assert set(hist) == {ACC, LOSS, "tokens_seen"}
    assert hist[ACC] == [(0, 0, 0.0), (10, 40960, 0.1), (20, 81920, 0.35), (30, 122880, 0.5)]
    assert hist[LOSS][1] == (5, 20480, pytest.approx(4.95))
    assert hist["tokens_seen"][-1] == (30, 122880, 122880.0)


def test_metric_histories_keeps_only_named_metrics_that_exist(store):
    tracker, (run, _), _ = store
    assert set(tracker.metric_histories(run, [ACC, "eval/nope/acc"])) == {ACC}
    assert tracker.metric_names(run) == sorted([ACC, LOSS, "tokens_seen"])


def test_a_repeated_step_keeps_the_last_value_and_missing_tokens_fall_back(store):
    tracker, _, _ = store
    run = tracker.start_run("scratch", {STAGE_TAG: "scratch"})
    tracker.log_metrics(run, [(3, 300, {ACC: 0.1})])
    time.sleep(0.01)
    tracker.log_metrics(run, [(3, 300, {ACC: 0.2})])
    from mlflow.entities import Metric

    tracker.client().log_batch(run, metrics=[Metric(LOSS, 1.0, int(time.time() * 1000), 7)])  # no tokens_seen at 7
    hist = tracker.metric_histories(run)
    assert hist[ACC] == [(3, 300, 0.2)]
    assert hist[LOSS] == [(7, 300, 1.0)]  # the latest tokens_seen before step 7


def test_find_stage_runs_oldest_first_and_only_that_stage(store):
    tracker, runs, sft = store
    found = tracker.find_stage_runs("exp", "pretrain")
    assert [r.run_id for r in found] == runs
    assert found[0].stage == "pretrain" and found[0].status == "FINISHED" and found[0].tags[STAGE_TAG] == "pretrain"
    assert [r.run_id for r in tracker.find_stage_runs(None, "sft")] == [sft]
    assert tracker.find_stage_runs("exp", "rl") == []
    assert {"pretrain", "sft"} <= set(tracker.stages_in("exp"))


def test_find_stage_runs_on_a_missing_experiment_lists_the_others_and_creates_nothing(store):
    tracker, _, _ = store
    with pytest.raises(LookupError, match="exp"):
        tracker.find_stage_runs("nope", "pretrain")
    assert tracker.client().get_experiment_by_name("nope") is None


def test_cutoff_on_the_store_finds_the_right_step(store):
    tracker, (first, second), _ = store
    rule = GateRule(all=[{"metric": ACC, "op": ">=", "value": 0.3}])
    report = run_cutoff(first, rule, tracker.metric_histories(first, rule.metrics()))
    assert (report.cutoff.step, report.cutoff.tokens_seen, report.cutoff.values) == (20, 81920, {ACC: 0.35})
    assert run_cutoff(second, rule, tracker.metric_histories(second, rule.metrics())).cutoff is None


def test_run_block_ends_finished_or_failed_and_reraises(store):
    tracker, _, _ = store
    with tracker.run("ok", {STAGE_TAG: "merge"}) as ok:
        pass
    with pytest.raises(KeyboardInterrupt):
        with tracker.run("interrupted", {STAGE_TAG: "merge"}) as bad:
            raise KeyboardInterrupt
    client = tracker.client()
    assert client.get_run(ok).info.status == "FINISHED"
    assert client.get_run(bad).info.status == "FAILED"


def test_carry_over_copies_the_interrupted_runs_history_up_to_the_resume_step(store):
    tracker, _, _ = store
    crashed = tracker.start_run("pretrain", {STAGE_TAG: "pretrain", "stagewise.stage_dir": "/w/stages/p-1"})
    tracker.log_metrics(crashed, [(step, step * 10, {LOSS: 9.0 - step}) for step in range(0, 7)])
    tracker.end_run(crashed, "FAILED")
    other = tracker.start_run("pretrain", {STAGE_TAG: "pretrain", "stagewise.stage_dir": "/w/stages/p-2"})
    tracker.log_metrics(other, [(0, 0, {LOSS: 1.0})])
    resumed = tracker.start_run("pretrain", {STAGE_TAG: "pretrain", "stagewise.stage_dir": "/w/stages/p-1"})
    assert tracker.carry_over(resumed, "/w/stages/p-1", until_step=4) == crashed
    history = tracker.metric_histories(resumed, [LOSS])[LOSS]
    assert [(s, t, v) for s, t, v in history] == [(s, s * 10, 9.0 - s) for s in range(0, 5)]
    assert tracker.client().get_run(resumed).data.tags["stagewise.resumed_from_run"] == crashed
    assert tracker.carry_over(other, "/w/stages/none", until_step=4) is None


def test_a_runs_link_opens_the_model_training_view_and_a_finished_runs_seconds(store, monkeypatch):
    """MLflow 3's UI opens the GenAI view (traces) unless the link asks for the model-training one; a
    password in a server's URI never reaches a link."""
    tracker = store[0]
    run = tracker.start_run("timed", {})
    time.sleep(0.05)
    tracker.end_run(run)
    assert tracker.ui_url(run) == (f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id()}/runs/{run}"
                                   "?workflowType=machine_learning")
    assert 0.04 <= tracker.run_seconds(run) < 5
    monkeypatch.setattr(Tracker, "experiment_id", lambda self: "7")  # no server to ask
    remote = Tracker(uri="https://me:secret@mlflow.example/", experiment="x")
    assert remote.ui_url("abc") == "https://mlflow.example/#/experiments/7/runs/abc?workflowType=machine_learning"
