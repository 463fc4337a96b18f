"""The merge task scores trained and merged checkpoints with the stage-wide scorers
(validation_task, suite_task), under `merge/trained/...` and `merge/<window>/...`.

Real pieces end to end, without Prefect (`.fn`): prepared data, three tiny checkpoints, a
streaming merge, lm-eval on a local task and a SQLite MLflow store.
"""

from __future__ import annotations

import json

import pytest

from stagewise.refs import CheckpointRef, PreparedRef

SUITE = ["world_arithmetic"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from stagewise.data.config import DataConfig, SourceConfig, TokenizerConfig
    from stagewise.data.prepare import prepare_data
    from stagewise.data.world.arithmetic import arithmetic_texts
    from stagewise.model.build import build_model
    from stagewise.model.checkpoint import CheckpointMeta, save_checkpoint
    from stagewise.model.config import ModelConfig
    from stagewise.store.tracking import Tracker

    base = tmp_path_factory.mktemp("merge_scoring")
    (base / "arith.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in arithmetic_texts(200, 0)))
    data = DataConfig(sources=[SourceConfig(name="arith", path="arith.jsonl")], validation_fraction=0.2)
    prepared = prepare_data(data, TokenizerConfig(vocab_size=400), base / "runs", seed=0, base_dir=base,
                            progress=False)
    tok_dir = prepared.root / "tokenizer"
    checkpoints = []
    for step in (1, 2, 3):
        model = build_model(ModelConfig(preset="tiny"), vocab_size=400, seed=step)
        path = save_checkpoint(base / "stage" / f"step-{step:08d}", model, tok_dir,
                               CheckpointMeta("pretrain", step, 100 * step, "h", None))
        checkpoints.append((str(path), 100 * step))
    tracker = Tracker(f"sqlite:///{base / 'mlflow.db'}", "merge", artifact_root=str(base / "artifacts"))
    return base, PreparedRef(root=str(prepared.root), digest=prepared.digest), checkpoints, tracker


def test_merge_scores_with_the_stage_scorers_under_merge_prefixes(env):
    from stagewise.tasks.evaluate import suite_task
    from stagewise.tasks.merge import merge_at_checkpoint_task

    base, prepared, checkpoints, tracker = env
    run_id = tracker.start_run("merge", {})
    out = merge_at_checkpoint_task.fn(checkpoints, checkpoints[-1][0], [200, 10_000], "minus-sqrt", "sequential", 0,
                                      str(base / "merged"), prepared, 32, 256, "h", tracker, run_id,
                                      suite=SUITE, suite_limit=2)
    assert set(out["merges"]) == {200}  # 10,000 tokens does not fit in 300
    names = set(tracker.metric_names(run_id))
    for prefix in ("merge/trained", "merge/200"):
        assert {f"{prefix}/loss", f"{prefix}/unigram_baseline", f"{prefix}/world_arithmetic/exact_match"} <= names
    assert not any(n.startswith("eval/") for n in names)
    hist = tracker.metric_histories(run_id, ["merge/trained/loss", "merge/200/world_arithmetic/exact_match"])
    assert hist["merge/trained/loss"] == [(3, 300, pytest.approx(out["trained"]))]
    assert [h[:2] for h in hist["merge/200/world_arithmetic/exact_match"]] == [(3, 300)]
    artifacts = {f.path for f in tracker.client().list_artifacts(run_id, "merge/trained")}
    assert "merge/trained/results_step00000003.json" in artifacts

    # the same scorer, called as the other stages call it, gives the same numbers under eval/
    ref = CheckpointRef(path=checkpoints[-1][0], step=3, tokens_seen=300)
    plain = suite_task.fn(ref, SUITE, 2)
    trained = tracker.metric_histories(run_id, ["merge/trained/world_arithmetic/exact_match"])
    assert trained["merge/trained/world_arithmetic/exact_match"][0][2] == plain["eval/world_arithmetic/exact_match"]
