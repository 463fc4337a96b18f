"""Cutoff promotion on a seeded SQLite store: the alias goes where the rule says, or stays.

One store per module (creating one runs MLflow's migrations): three pretrain runs with metric
histories, each with its final checkpoint (a tiny real directory) registered as a version of
model `exp` under the stage alias, as every stage run does. Most tests call `promote` directly;
one calls the Prefect flow (which starts Prefect's ephemeral API).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from stagewise.data.errors import BadInput
from stagewise.flows.promote import PROMOTED_BY_TAG, PROMOTION_TAG, check_request, promote, promote_flow
from stagewise.store.tracking import STAGE_TAG, Tracker

ACC = "eval/world_arithmetic/exact_match"
LOSS = "eval/validation/loss"
# (accuracy at steps 0, 10, 20, 30; validation loss at the same steps)
RUNS = {
    "early": ((0.0, 0.35, 0.4, 0.45), (5.0, 4.0, 3.5, 3.4)),  # holds first, ends at 0.45
    "best": ((0.0, 0.1, 0.35, 0.7), (5.0, 4.5, 3.9, 3.6)),    # holds later, ends highest
    "never": ((0.0, 0.05, 0.1, 0.2), (5.0, 3.0, 2.5, 2.0)),   # never reaches 0.3, lowest loss
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("promote")
    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", "exp", artifact_root=str(root / "artifacts"))
    parent = tracker.start_run("tiny", {})
    ids, versions = {}, {}
    for name, (accs, losses) in RUNS.items():
        run = tracker.start_run(name, {STAGE_TAG: "pretrain"}, parent)
        records = [(step, step * 4096, {ACC: a, LOSS: v}) for step, a, v in zip((0, 10, 20, 30), accs, losses)]
        tracker.log_metrics(run, records)
        ckpt = root / "stages" / name / "step-00000030"
        ckpt.mkdir(parents=True)
        (ckpt / "config.json").write_text(json.dumps({"run": name}))
        versions[name] = tracker.register_checkpoint("exp", ckpt, run, alias="pretrain")
        tracker.end_run(run)
        ids[name] = run
        time.sleep(0.01)  # distinct start times
    return tracker, ids, versions, root


def rule_file(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.write_text(text)
    return path


def test_the_alias_moves_to_the_run_that_passes_best_with_its_evidence(store):
    tracker, ids, versions, root = store
    path = rule_file(root, "acc.yaml", f'all: [{{metric: {ACC}, op: ">=", value: 0.3}}]\n')
    rule, alias, uri = check_request("exp", "pretrain", str(path), None, tracker.uri)
    assert alias == "pretrain-champion" and uri == tracker.uri
    decision = promote(tracker, "exp", "pretrain", rule, alias, str(path))
    assert tracker.alias_holder("exp", alias) == versions["best"]
    assert decision["moved"] and decision["previous_version"] is None and decision["new_version"] == versions["best"]
    rows = {r["run_name"]: r for r in decision["considered"]}
    assert [n for n, r in rows.items() if r["passes"]] == ["early", "best"]
    assert rows["early"]["cutoff"]["step"] == 10 and rows["best"]["cutoff"]["step"] == 20
    assert rows["never"]["why"] == "the rule never held" and rows["never"]["cutoff"] is None
    assert rows["best"]["primary"] == pytest.approx(0.7)
    # The evidence: a run of its own (not a stage run) with the whole decision, and the version knows it.
    client = tracker.client()
    evidence = client.get_run(decision["promotion_run"])
    assert evidence.data.tags[PROMOTION_TAG] == "pretrain" and STAGE_TAG not in evidence.data.tags
    assert evidence.data.tags["stagewise.promotion.winner_run"] == ids["best"]
    logged = json.loads(Path(client.download_artifacts(decision["promotion_run"], "promotion.json", str(root))).read_text())
    assert logged["winner"]["run_id"] == ids["best"] and len(logged["considered"]) == 3
    assert client.get_model_version("exp", versions["best"]).tags[PROMOTED_BY_TAG] == decision["promotion_run"]
    assert [r.run_id for r in tracker.find_stage_runs("exp", "pretrain")] == list(ids.values())  # not read as a stage run
    assert tracker.alias_holder("exp", "pretrain") == versions["never"]  # the stage's own alias is untouched


def test_a_lower_is_better_rule_picks_the_lowest_final_value(store):
    tracker, _, versions, root = store
    path = rule_file(root, "loss.yaml", f'gate:\n  suite: world\n  all:\n    - {{metric: {LOSS}, op: "<", value: 3.95}}\n')
    rule, alias, _ = check_request("exp", "pretrain", str(path), "loss-champion", tracker.uri)
    decision = promote(tracker, "exp", "pretrain", rule, alias)
    assert decision["winner"]["run_name"] == "never" and tracker.alias_holder("exp", alias) == versions["never"]


def test_no_run_passing_leaves_the_alias_where_it_was_and_says_so(store):
    tracker, _, versions, root = store
    tracker.set_alias("exp", "keep-champion", versions["early"])
    path = rule_file(root, "high.yaml", f'all: [{{metric: {ACC}, op: ">=", value: 0.9}}]\n')
    rule, alias, _ = check_request("exp", "pretrain", str(path), "keep-champion", tracker.uri)
    decision = promote(tracker, "exp", "pretrain", rule, alias)
    assert tracker.alias_holder("exp", "keep-champion") == versions["early"]
    assert decision["winner"] is None and not decision["moved"]
    assert decision["outcome"] == f"no run passes the rule; keep-champion left at version {versions['early']}"
    tags = tracker.client().get_run(decision["promotion_run"]).data.tags
    assert tags["stagewise.promotion.outcome"] == "none passed"
    assert tags["stagewise.promotion.previous_version"] == tags["stagewise.promotion.new_version"] == versions["early"]


def test_sft_promotes_its_last_sub_stage_as_the_stage_run_s_version(store):
    """Sub-stage runs hold the gate histories but register nothing; the stage run registers the final checkpoint."""
    tracker, _, _, root = store
    stage_run = tracker.start_run("sft", {STAGE_TAG: "sft", "stagewise.substages": "chat,polish"})
    subs = {}
    for name, accs in (("chat", (0.0, 0.5)), ("polish", (0.0, 0.4))):
        subs[name] = tracker.start_run(f"sft/{name}", {STAGE_TAG: "sft", "stagewise.substage": name}, stage_run)
        tracker.log_metrics(subs[name], [(0, 0, {ACC: accs[0]}), (10, 4096, {ACC: accs[1]})])
        tracker.end_run(subs[name])
    ckpt = root / "stages" / "sft" / "final"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    version = tracker.register_checkpoint("exp", ckpt, stage_run, alias="sft")
    tracker.end_run(stage_run)
    path = rule_file(root, "sft.yaml", f'all: [{{metric: {ACC}, op: ">=", value: 0.3}}]\n')
    rule, alias, _ = check_request("exp", "sft", str(path), None, tracker.uri)
    decision = promote(tracker, "exp", "sft", rule, alias)
    rows = {r["run_name"]: r for r in decision["considered"]}
    assert set(rows) == {"sft/chat", "sft/polish"}  # the stage run holds no gate histories
    assert "only the last sub-stage" in rows["sft/chat"]["why"] and not rows["sft/chat"]["passes"]
    assert decision["winner"]["run_id"] == subs["polish"] and tracker.alias_holder("exp", "sft-champion") == version


def test_bad_input_is_refused_with_a_located_message_before_the_store_is_touched(store, tmp_path):
    tracker, _, _, _ = store
    bad = rule_file(tmp_path, "bad.yaml", f'all:\n  - {{metric: {ACC}, op: "~", value: 0.3}}\n')
    with pytest.raises(BadInput, match=r"all\.0\.op: .*bad\.yaml:2\)"):
        check_request("exp", "pretrain", str(bad), None, tracker.uri)
    with pytest.raises(BadInput, match="rule: rule file not found"):
        check_request("exp", "pretrain", str(tmp_path / "missing.yaml"), None, tracker.uri)
    good = rule_file(tmp_path, "good.yaml", f'all: [{{metric: {ACC}, op: ">=", value: 0.3}}]\n')
    with pytest.raises(BadInput, match="every pretrain run moves that alias"):
        check_request("exp", "pretrain", str(good), "pretrain", tracker.uri)
    with pytest.raises(BadInput, match="alias 'v2'"):
        check_request("exp", "pretrain", str(good), "v2", tracker.uri)
    with pytest.raises(BadInput, match="no MLflow store at sqlite:///"):
        check_request("exp", "pretrain", str(good), None, f"sqlite:///{tmp_path / 'none.db'}")
    assert not (tmp_path / "none.db").exists()
    rule, alias, _ = check_request("exp", "rl", str(good), None, tracker.uri)
    with pytest.raises(BadInput, match="no runs of stage 'rl'.*stages there: pretrain"):
        promote(tracker, "exp", "rl", rule, alias)
    missing = rule_file(tmp_path, "missing-metric.yaml", 'all: [{metric: eval/nope/acc, op: ">=", value: 0.3}]\n')
    rule, alias, _ = check_request("exp", "pretrain", str(missing), None, tracker.uri)
    with pytest.raises(BadInput, match="eval/nope/acc"):
        promote(tracker, "exp", "pretrain", rule, alias)


def test_the_cli_exits_2_naming_the_rule_files_line(store, tmp_path, capsys):
    from stagewise.cli import main

    tracker, _, _, _ = store
    bad = rule_file(tmp_path, "bad.yaml", "all:\n  - {metric: m, op: '>=', value: high}\n")
    with pytest.raises(SystemExit) as exit_:
        main(["promote", "--experiment", "exp", "--stage", "pretrain", "--rule", str(bad), "--tracking-uri", tracker.uri])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "all.0.value" in err and f"{bad}:2" in err and "Traceback" not in err
    good = rule_file(tmp_path, "good.yaml", f'all: [{{metric: {ACC}, op: ">=", value: 0.3}}]\n')
    with pytest.raises(SystemExit) as exit_:
        main(["promote", "--experiment", "exp", "--stage", "pretrain", "--rule", str(good), "--alias", "cli-champion",
              "--tracking-uri", tracker.uri])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "cli-champion -> version" in out and "run never" in out and "the rule never held" in out
    assert tracker.alias_holder("exp", "cli-champion") is not None


def test_the_flow_promotes_and_a_bad_rule_fails_it(store, open_forms):
    tracker, _, versions, root = store
    path = rule_file(root, "flow.yaml", f'all: [{{metric: {ACC}, op: ">=", value: 0.3}}]\n')
    decision = promote_flow(experiment="exp", stage="pretrain", rule=str(path), alias="flow-champion", tracking_uri=tracker.uri)
    assert decision["winner"]["run_name"] == "best" and tracker.alias_holder("exp", "flow-champion") == versions["best"]
    bad = rule_file(root, "flow-bad.yaml", "all: 3\n")
    with pytest.raises(BadInput, match="flow-bad.yaml:1"):
        promote_flow(experiment="exp", stage="pretrain", rule=str(bad), tracking_uri=tracker.uri)
