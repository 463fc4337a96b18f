"""End to end: gated SFT sub-stages through `stagewise run`, and `stagewise cutoffs` on what they logged.

(a) a gate that holds early stops its sub-stage before the token budget and hands on the
    checkpoint it names; (b) a gate that can never hold, with `on_budget_exhausted: fail`,
    makes `stagewise run` exit 1 with the evidence in the message; (c) `stagewise cutoffs`
    replays the same rule on the store and finds the cutoff the gate used.
Each run is `--stages sft` from the session's shared pretraining checkpoint (model.from),
with a small recipe that inherits tiny.yaml and replaces its sub-stages by one gated one.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

BUDGET = 65_536  # 16 steps of 8 x 512 tokens; the gate below holds long before
EVERY = 8_192
HOLDS_EARLY = [{"metric": "eval/sft_dev/loss", "op": "<", "value": -0.4, "relative": True}]
NEVER_HOLDS = [{"metric": "eval/sft_dev/exact_match", "op": ">=", "value": 0.99}]


def gated_recipe(path: Path, tiny: Path, tokens: int, rule: list[dict], on_exhausted: str, **more) -> Path:
    gate = {"suite": "chat", "eval_limit": 8, "eval_every_tokens": EVERY, "all": rule,
            "on_budget_exhausted": on_exhausted, **more}
    path.write_text(textwrap.dedent(f"""\
        base: {tiny}
        eval:
          chat: [world_chat_format]
        stages:
          sft:
            eval_suite: null
            data:
              heldout_limit: 40
            stages:
              - name: gated
                tokens: {tokens}
                seq_length: 512
                global_batch: 8
                micro_batch: 4
                optimizer: {{lr: 1.0e-3, min_lr: 1.0e-4, weight_decay: 0.0}}
                schedule: {{kind: constant, warmup_tokens: 4096}}
                blend: {{weights: {{arithmetic: 1, sorting: 1, lookup: 1, format: 1}}}}
                gate: {json.dumps(gate)}
        """))
    return path


def run_gated(cli, tiny_pretrain, tmp_path: Path, tokens: int, rule: list[dict], on_exhausted: str):
    recipe = gated_recipe(tmp_path / "gated.yaml", cli.tiny, tokens, rule, on_exhausted)
    workdir = tmp_path / "work"
    proc = cli("run", str(recipe), "--stages", "sft", *cli.sets(f"workdir={workdir}", f"model.from={tiny_pretrain.checkpoint}"),
               "--json")
    return proc, workdir


@pytest.fixture(scope="module")
def early_stop(cli, tiny_pretrain, tmp_path_factory):
    proc, workdir = run_gated(cli, tiny_pretrain, tmp_path_factory.mktemp("gate-stop"), BUDGET, HOLDS_EARLY, "continue")
    return cli.summary(proc), workdir


@pytest.mark.slow
def test_gate_that_holds_stops_before_the_budget(early_stop):
    from mlflow import MlflowClient

    summary, _ = early_stop
    sft = summary["stages"][0]
    gate = sft["gate"]
    assert gate["action"] == "stop" and gate["held"] and gate["substage"] == "gated", gate
    meta = json.loads((Path(sft["checkpoint"]) / "stagewise.json").read_text())
    assert meta["tokens_seen"] == gate["tokens_seen"] < BUDGET
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    exp = client.get_experiment_by_name(summary["experiment"])
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("stagewise.substage") == "gated"]
    assert run.data.tags["stagewise.gate"] == "stop" and "rule held" in run.data.tags["stagewise.gate_reason"]
    assert max(m.value for m in client.get_metric_history(run.info.run_id, "tokens_seen")) < BUDGET
    decisions = [a.path for a in client.list_artifacts(run.info.run_id, "gate")]
    assert f"gate/decision_{gate['tokens_seen']:012d}.json" in decisions
    cond = gate["evidence"]["conditions"][0]
    assert cond["holds"] and cond["current"] < cond["start"] - 0.4


@pytest.mark.slow
def test_cutoffs_replays_the_rule_the_gate_used(early_stop, cli, tmp_path):
    summary, workdir = early_stop
    rule = tmp_path / "rule.yaml"
    rule.write_text(json.dumps({"all": HOLDS_EARLY}))
    proc = cli("cutoffs", "--experiment", summary["experiment"], "--stage", "sft", "--rule", str(rule),
               "--tracking-uri", summary["tracking_uri"], "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (run,) = report["runs"]  # the sub-stage run; the stage run (no gate histories) is skipped
    assert run["run_name"] == "sft/gated" and run["error"] is None
    gate = summary["stages"][0]["gate"]
    assert (run["cutoff"]["step"], run["cutoff"]["tokens_seen"]) == (gate["step"], gate["tokens_seen"])


@pytest.mark.slow
def test_gate_that_never_holds_fails_the_run_with_its_evidence(cli, tiny_pretrain, tmp_path):
    proc, _ = run_gated(cli, tiny_pretrain, tmp_path, 2 * EVERY, NEVER_HOLDS, "fail")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    error = json.loads(proc.stdout[proc.stdout.index("{"):])["error"]
    assert "GateFailed: stage sft/gated: gate failed: budget exhausted at 16384 tokens" in error
    assert "eval/sft_dev/exact_match = " in error and ">= 0.99" in error


@pytest.mark.slow
def test_a_gate_stopped_stage_reruns_cleanly(early_stop, cli, tiny_pretrain):
    """The stopped sub-stage is a finished step: a plain rerun hands on the same checkpoint and decision."""
    summary, workdir = early_stop
    proc = cli("run", str(workdir.parent / "gated.yaml"), "--stages", "sft",
               *cli.sets(f"workdir={workdir}", f"model.from={tiny_pretrain.checkpoint}"), "--json")
    again = cli.summary(proc)["stages"][0]
    first = summary["stages"][0]
    assert again["reused"] and again["run_id"] != first["run_id"]
    assert again["checkpoint"] == first["checkpoint"] and again["gate"] == first["gate"]
    assert (again["before"], again["after"]) == (first["before"], first["after"])
