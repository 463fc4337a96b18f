"""Metrics survive an unreachable MLflow server: kept in order, sent once, before any read.

The store is a real SQLite one; between the Tracker and it sits a client that fails like a
stopped server (requests' "connection refused") while `outage.down` is set, or fails in the
given way. One store per module (creating one runs MLflow's migrations, seconds each).
"""

from __future__ import annotations

import pickle

import pytest
import requests
from mlflow import MlflowClient
from mlflow.exceptions import RestException

import stagewise.store.tracking as tracking
from stagewise.store.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, SPOOL_DIR, Tracker

LOSS = "train/lm_loss"


class Outage:
    """What the fake server does: answer, refuse connections, or raise `error` once."""

    def __init__(self):
        self.down = False
        self.error: Exception | None = None
        self.after_commit: Exception | None = None
        self.calls: list[tuple[str, tuple]] = []


class FlakyClient:
    def __init__(self, real: MlflowClient, outage: Outage):
        self._real, self._outage = real, outage

    def __getattr__(self, name):
        attr = getattr(self._real, name)

        def call(*args, **kwargs):
            o = self._outage
            o.calls.append((name, tuple(m.step for m in kwargs.get("metrics", ()) if m.key == LOSS)))
            if o.down:
                raise requests.exceptions.ConnectionError("[Errno 111] Connection refused")
            if o.error is not None:
                err, o.error = o.error, None
                raise err
            result = attr(*args, **kwargs)
            if o.after_commit is not None:  # the server stored it, the answer got lost
                err, o.after_commit = o.after_commit, None
                raise err
            return result

        return call


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    Tracker(uri, "exp", artifact_root=str(root / "mlartifacts")).experiment_id()
    return root, uri


@pytest.fixture
def outage(monkeypatch, store):
    state = Outage()
    monkeypatch.setattr(Tracker, "_raw_client", lambda self: FlakyClient(MlflowClient(self.uri), state))
    tracking._DEFER.clear()
    tracking._MEMORY.clear()
    yield state
    tracking._DEFER.clear()


def make(store, **kw) -> Tracker:
    root, uri = store
    return Tracker(uri, "exp", artifact_root=str(root / "mlartifacts"), **{"retry_seconds": 0.0, **kw})


def steps(a: int, b: int):
    return [(s, s * 100, {LOSS: 10.0 - s / 10}) for s in range(a, b)]


def loss_steps(tracker: Tracker, run_id: str) -> list[int]:
    """Every train/lm_loss point MLflow stored, duplicates included, in stored order."""
    return [m.step for m in MlflowClient(tracker.uri).get_metric_history(run_id, LOSS)]


def test_metrics_logged_while_down_are_spooled_and_sent_in_order_once(store, outage):
    tracker = make(store)
    run = tracker.start_run("r", {})
    tracker.log_metrics(run, steps(0, 3))
    outage.down = True
    for a in (3, 5, 7):
        tracker.log_metrics(run, steps(a, a + 2))  # never raises
    spool = tracker._spool_path(run)
    assert spool == store[0] / SPOOL_DIR / f"{run}.jsonl" and spool.exists()
    assert sorted(loss_steps(tracker, run)) == [0, 1, 2]
    outage.down = False
    outage.calls.clear()
    assert list(tracker.metric_histories(run, [LOSS])[LOSS]) == [(s, s * 100, 10.0 - s / 10) for s in range(9)]
    assert sorted(loss_steps(tracker, run)) == list(range(9))  # each point once
    sent = [s for name, s in outage.calls if name == "log_batch"]
    assert sent and [s for batch in sent for s in batch] == list(range(3, 9))  # oldest first, before the read
    assert not spool.exists()


def test_while_deferred_new_batches_queue_behind_the_old_ones(store, outage):
    tracker = make(store)
    run = tracker.start_run("r", {})
    outage.down = True
    tracker.log_metrics(run, steps(0, 2))
    outage.down = False  # back, but log_metrics waits a moment before trying again
    tracker.log_metrics(run, steps(2, 4))
    assert loss_steps(tracker, run) == []
    assert [p[3] for batch in tracker._pending(run) for p in batch if p[0] == LOSS] == [0, 1, 2, 3]
    tracking._DEFER.clear()  # the wait is over
    tracker.log_metrics(run, steps(4, 5))
    assert sorted(loss_steps(tracker, run)) == [0, 1, 2, 3, 4]
    assert tracker._pending(run) == []


def test_reads_never_see_a_partial_history_while_the_server_is_away(store, outage):
    tracker = make(store)
    run = tracker.start_run("r", {})
    outage.down = True
    tracker.log_metrics(run, steps(0, 4))
    with pytest.raises(requests.exceptions.ConnectionError):
        tracker.metric_histories(run, [LOSS])
    with pytest.raises(requests.exceptions.ConnectionError):
        tracker.client().get_metric_history(run, LOSS)  # the raw-client door flushes too
    outage.down = False
    assert sorted(m.step for m in tracker.client().get_metric_history(run, LOSS)) == [0, 1, 2, 3]


def test_a_spool_left_by_a_killed_process_is_sent_by_the_next_one(store, outage):
    tracker = make(store)
    run = tracker.start_run("r", {})
    outage.down = True
    tracker.log_metrics(run, steps(0, 5))
    tracking._DEFER.clear()  # a new process knows nothing of the old one
    outage.down = False
    other = pickle.loads(pickle.dumps(tracker))
    assert other == tracker
    other.start_run("next", {})  # any new run sends what earlier processes left behind
    assert sorted(loss_steps(tracker, run)) == [0, 1, 2, 3, 4]
    assert not tracker._spool_path(run).exists()


def test_a_batch_the_server_stored_but_did_not_acknowledge_is_stored_once(store, outage):
    tracker = make(store)
    run = tracker.start_run("r", {})
    outage.after_commit = requests.exceptions.ReadTimeout("read timed out")
    tracker.log_metrics(run, steps(0, 3))  # stored, yet spooled: the client cannot know
    assert tracker._pending(run)
    assert tracker.flush(run)
    assert sorted(loss_steps(tracker, run)) == [0, 1, 2]


def test_a_deterministic_error_raises_and_is_not_retried(store, outage):
    tracker = make(store, retry_seconds=30.0)
    run = tracker.start_run("r", {})
    outage.error = RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad metric"})
    outage.calls.clear()
    with pytest.raises(RestException):
        tracker.log_metrics(run, steps(0, 2))
    assert [n for n, _ in outage.calls] == ["log_batch"]
    assert tracker._pending(run) == []
    assert tracker._spool_path(run).with_suffix(".rejected.jsonl").exists()
    outage.error = RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such run"})
    outage.calls.clear()
    with pytest.raises(RestException):
        tracker.set_tags(run, {"a": "b"})
    assert [n for n, _ in outage.calls] == ["log_batch"]


def test_other_calls_retry_a_transient_error(store, outage):
    tracker = make(store, retry_seconds=2.0)
    run = tracker.start_run("r", {})
    outage.error = requests.exceptions.ConnectionError("[Errno 111] Connection refused")
    tracker.set_tags(run, {"k": "v"})
    assert MlflowClient(tracker.uri).get_run(run).data.tags["k"] == "v"


def test_run_block_sends_pending_metrics_before_ending_the_run(store, outage):
    tracker = make(store)
    with tracker.run("ok", {}) as run:
        outage.down = True
        tracker.log_metrics(run, steps(0, 3))
        outage.down = False
    assert MlflowClient(tracker.uri).get_run(run).info.status == "FINISHED"
    assert sorted(loss_steps(tracker, run)) == [0, 1, 2]


def test_a_failing_block_with_the_server_away_keeps_the_metrics_and_raises_its_own_error(store, outage):
    tracker = make(store)
    with pytest.raises(KeyError, match="boom"):
        with tracker.run("bad", {}) as run:
            outage.down = True
            tracker.log_metrics(run, steps(0, 2))
            raise KeyError("boom")
    outage.down = False
    assert [p[3] for batch in tracker._pending(run) for p in batch if p[0] == LOSS] == [0, 1]
    assert tracker.flush(run) and sorted(loss_steps(tracker, run)) == [0, 1]


def test_without_an_artifact_root_metrics_are_kept_in_memory(store, outage):
    _, uri = store
    tracker = Tracker(uri, "exp", retry_seconds=0.0)
    run = tracker.start_run("r", {})
    outage.down = True
    tracker.log_metrics(run, steps(0, 3))
    assert tracker._spool_path(run) is None and tracker._pending(run)
    outage.down = False
    assert [s for s, _, _ in tracker.metric_histories(run, [LOSS])[LOSS]] == [0, 1, 2]


def test_the_experiment_opens_in_the_model_training_view(store, outage):
    root, uri = store
    assert MlflowClient(uri).get_experiment_by_name("exp").tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    MlflowClient(uri).create_experiment("older")  # made before the tag existed
    Tracker(uri, "older").experiment_id()
    assert MlflowClient(uri).get_experiment_by_name("older").tags[EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_a_tracker_travels_between_prefect_tasks_as_plain_data(store):
    from pydantic import TypeAdapter

    tracker = make(store, retry_seconds=5.0)
    adapter = TypeAdapter(Tracker)
    assert adapter.validate_python(adapter.dump_python(tracker)) == tracker
    assert pickle.loads(pickle.dumps(tracker)) == tracker


def test_mlflow_own_http_retries_are_off_unless_set(monkeypatch, store):
    _, uri = store
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    Tracker(uri, "exp")._raw_client()
    assert tracking.os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    Tracker(uri, "exp")._raw_client()
    assert tracking.os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"


def test_resume_carries_over_what_the_killed_run_still_had_in_its_spool(store, outage, monkeypatch):
    monkeypatch.setattr(Tracker, "_send_leftovers", lambda self: None)  # carry_over alone must send them
    tracker = make(store)
    stage_dir = "/w/stages/outage-1"
    crashed = tracker.start_run("pretrain", {"stagewise.stage_dir": stage_dir})
    tracker.log_metrics(crashed, steps(1, 3))
    outage.down = True
    tracker.log_metrics(crashed, [(s, s * 100, {LOSS: 1.0, "eval/x": 0.5}) for s in range(3, 6)])  # a new key
    tracking._DEFER.clear()  # the process was killed; --resume starts a new one
    outage.down = False
    resumed = tracker.start_run("pretrain", {"stagewise.stage_dir": stage_dir})
    assert tracker.carry_over(resumed, stage_dir, until_step=4) == crashed
    hist = tracker.metric_histories(resumed, [LOSS, "eval/x"])
    assert [s for s, _, _ in hist[LOSS]] == [1, 2, 3, 4]
    assert [s for s, _, _ in hist["eval/x"]] == [3, 4]
