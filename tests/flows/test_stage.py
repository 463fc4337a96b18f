"""The stage contract's plain parts: upstream results, where a stage starts, resume, finish and reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagewise.flows.stage import (
    StageContext,
    StageStateError,
    StartError,
    Upstream,
    checkpoint_hash,
    finish,
    resume_point,
    reused_result,
    start_checkpoint,
)
from stagewise.model.runtime import Runtime
from stagewise.refs import StageResult, StageSummary
from stagewise.store.steps import finished
from stagewise.store.tracking import Tracker


def _ckpt(root: Path, step: int, tokens: int) -> Path:
    d = root / f"step-{step:08d}"
    d.mkdir(parents=True)
    (d / "stagewise.json").write_text(json.dumps({"stage": "pretrain", "step": step, "tokens_seen": tokens,
                                                  "recipe_hash": "r", "weight_sha256": f"sha{step}"}))
    return d


def test_each_stage_is_given_only_the_results_it_reads():
    from stagewise.flows.registry import registered

    done = {n: StageResult(stage=n, checkpoint=f"/ck/{n}", run_id=n) for n in ("pretrain", "merge", "sft", "rl")}
    up = Upstream(results=list(done.values()))
    given = lambda name, block=None: [r.stage for r in up.read_by(registered(name), block).results]  # noqa: E731
    assert given("rl") == ["rl"]  # the one handed on (here the last RL; a second would read it)
    assert [r.stage for r in Upstream(results=[done["pretrain"], done["sft"]]).read_by(registered("rl"), None).results] \
        == ["sft"]
    assert given("merge") == ["pretrain", "rl"]  # what it needs, and the one handed on
    assert given("pretrain") == []
    from stagewise.flows.distill import select as distill_block
    from stagewise.flows.quantize import select as quantize_block
    from stagewise.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml").recipe  # student sft, teacher rl
    assert given("distill", distill_block(recipe)) == ["sft", "rl"]
    assert given("quantize", quantize_block(recipe)) == ["pretrain", "rl"]


def test_upstream_finds_a_stage_and_the_last_one():
    pre = StageResult(stage="pretrain", checkpoint="/ck/pre", run_id="r")
    merged = StageResult(stage="merge", checkpoint="/ck/merged", run_id="m")
    up = Upstream(results=[pre, merged])
    assert up.of("pretrain") is pre and up.last() is merged and up.of("sft") is None
    assert Upstream().last() is None


def test_start_is_the_previous_stage_then_model_from_else_a_clear_error():
    up = Upstream(results=[StageResult(stage="merge", checkpoint="/ck/merged", run_id="m")])
    assert start_checkpoint(up, "/ck/from") == "/ck/merged"
    assert start_checkpoint(Upstream(), "/ck/from") == "/ck/from"
    with pytest.raises(StartError, match=r"--stages pretrain,<stage>.*or set model.from"):
        start_checkpoint(Upstream(), None)


def test_an_interrupted_step_continues_only_with_resume(tmp_path):
    assert resume_point(tmp_path / "fresh", resume=False) is None
    _ckpt(tmp_path, 4, 16384)
    _ckpt(tmp_path, 8, 32768)
    with pytest.raises(StageStateError, match=r"interrupted run \(last checkpoint at 32,768 tokens\); pass --resume"):
        resume_point(tmp_path, resume=False)
    ref = resume_point(tmp_path, resume=True)
    assert (ref.step, ref.tokens_seen, ref.sha256) == (8, 32768, "sha8")


def test_a_checkpoint_is_identified_by_its_weights(tmp_path):
    assert checkpoint_hash(_ckpt(tmp_path, 1, 10)) == "sha1"
    plain = tmp_path / "hf"
    plain.mkdir()
    assert checkpoint_hash(plain) == str(plain.resolve())  # a plain HF checkpoint: its place


class RecordingTracker(Tracker):
    def __new__(cls, *a, **k):
        return object.__new__(cls)

    def __init__(self):
        object.__setattr__(self, "calls", [])
        object.__setattr__(self, "experiment", "exp")

    def register_checkpoint(self, name, path, run_id, alias, parent=None, lineage=None):
        self.calls.append(("register", str(path), run_id, alias))
        self.calls.append(("lineage", parent, lineage))

    def set_tags(self, run_id, tags):
        self.calls.append(("tags", run_id, tags))

    def log_metrics(self, run_id, records):
        self.calls.append(("metrics", run_id, list(records)))


def test_finish_marks_the_step_and_a_rerun_reuses_it(tmp_path, monkeypatch):
    monkeypatch.setattr("stagewise.flows.stage.reuse", lambda kind, directory, record: record)  # Prefect's side: e2e tests
    tracker = RecordingTracker()
    ctx = StageContext(workdir=str(tmp_path), base_dir=".", seed=1, recipe_hash="h", tracker=tracker,
                       runtime=Runtime())
    out = tmp_path / "stages" / "pretrain-abc"
    ckpt = _ckpt(out, 3, 300)
    assert reused_result(ctx, "pretrain", "run-2", out) is None  # not finished yet
    summary = StageSummary(metric="eval/validation/loss", before=8.3, after=3.0, tokens=300)
    result = StageResult(stage="pretrain", checkpoint=str(ckpt), run_id="run-1", summary=summary)
    finish(ctx, out, result, {"eval/validation/loss": 3.0}, at=(3, 300))
    assert finished(out)["result"]["run_id"] == "run-1"
    again = reused_result(ctx, "pretrain", "run-2", out)
    assert again.reused and again.run_id == "run-2" and again.checkpoint == str(ckpt) and again.summary == summary
    assert ("metrics", "run-2", [(3, 300, {"eval/validation/loss": 3.0})]) in tracker.calls
    tags = next(c[2] for c in tracker.calls if c[0] == "tags")
    assert tags["stagewise.reused"] == "true" and tags["stagewise.reused_from_run"] == "run-1"
    assert ("register", str(ckpt), "run-2", "pretrain") in tracker.calls
    (_, parent, tags), *_ = [c for c in tracker.calls if c[0] == "lineage"]
    assert parent is None and tags["stagewise.recipe_hash"] == "h" and tags["stagewise.stage_dir"] is not None


def test_a_finished_step_whose_checkpoint_is_gone_runs_again(tmp_path, monkeypatch):
    monkeypatch.setattr("stagewise.flows.stage.reuse", lambda kind, directory, record: record)
    ctx = StageContext(workdir=str(tmp_path), base_dir=".", seed=1, recipe_hash="h", tracker=RecordingTracker())
    out = tmp_path / "merge-x"
    finish(ctx, out, StageResult(stage="merge", checkpoint=str(tmp_path / "gone"), run_id="r"))
    assert reused_result(ctx, "merge", "r2", out) is None
