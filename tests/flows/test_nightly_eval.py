"""The nightly evaluation flow: the newest registered checkpoint, scored on the recipe's suites."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from stagewise.data.errors import BadInput
from stagewise.flows.nightly_eval import evaluate_latest_flow, newest_checkpoint, suites_to_run
from stagewise.store.tracking import Tracker

RECIPE = """\
name: nightly
workdir: {workdir}
tokenizer: {{vocab_size: 300}}
data:
  world: {{facts: 40, arithmetic: 40, stdlib_files: 0, retrieval: 0, noisy: 20}}
  sources:
    - {{name: facts, path: "@world/facts.jsonl"}}
eval:
  quick: [world_compare_mc]
stages:
  pretrain:
    tokens: 8192
    seq_length: 32
    global_batch: 4
    micro_batch: 2
    phases: [{{name: only, until: 1.0, blend: {{facts: 1}}}}]
"""


def test_suites_are_the_named_one_or_all_and_bad_names_are_located():
    block = {"quick": ["a"], "full": ["a", "b"]}
    assert suites_to_run(block, None) == block and suites_to_run(block, "full") == {"full": ["a", "b"]}
    with pytest.raises(BadInput, match="suite: the recipe has no eval suite 'quik'; did you mean quick"):
        suites_to_run(block, "quik")
    with pytest.raises(BadInput, match="names no eval suites"):
        suites_to_run({}, None)


def test_the_newest_stage_with_a_version_is_scored(tmp_path, tiny_checkpoint, open_forms):
    checkpoint = tiny_checkpoint
    workdir = tmp_path / "w"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(workdir=workdir))
    tracker = Tracker(f"sqlite:///{(workdir / 'mlflow.db').resolve()}", "nightly", artifact_root=str(workdir / "mlartifacts"))
    with pytest.raises(BadInput, match="no registered checkpoint in experiment 'nightly' yet"):
        newest_checkpoint(tracker)
    run = tracker.start_run("pretrain", {})
    version = tracker.register_checkpoint("nightly", checkpoint, run, alias="pretrain")
    assert newest_checkpoint(tracker) == {"stage": "pretrain", "version": version, "checkpoint": str(checkpoint.resolve())}
    out = evaluate_latest_flow(str(recipe), limit=4)
    assert out["version"] == version and "eval/world_compare_mc/acc" in out["metrics"]
    scored = MlflowClient(tracking_uri=tracker.uri).get_run(out["run_id"])
    assert scored.data.tags["stagewise.evaluated_version"] == version
    assert scored.data.metrics["eval/world_compare_mc/acc"] == out["metrics"]["eval/world_compare_mc/acc"]
