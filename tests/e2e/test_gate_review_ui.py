"""End to end: a person at the gate, through the Prefect UI in headless Chromium.

`stagewise run --stages sft` with a gate that never holds and `review: undecided`, against a real
`prefect server`: when the budget runs out the SFT flow run pauses with the gate's evidence; a person
opens its page, presses Resume and answers the form. (a) extend, then — asked again — approve: the
pipeline goes on, the sub-stage trained one more chunk, and the review is on its MLflow run and in the
closing table; (b) stop: the pipeline fails, saying who stopped it and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, sets
from tests.e2e.servers import answer_in_prefect_ui, paused_run, prefect_server
from tests.e2e.test_gates_pipeline import EVERY, NEVER_HOLDS, gated_recipe

BUDGET = 2 * EVERY


def reviewed_run(cli, tiny_pretrain, tmp_path, answers: list[dict[str, str]]) -> tuple[int, str, str]:
    """`stagewise run --stages sft` with the reviewed gate against a real `prefect server`; each pause
    answered in the Prefect UI with the next of `answers` (the first's form screenshot kept); the run's
    exit code, stdout and stderr."""
    recipe = gated_recipe(tmp_path / "gated.yaml", cli.tiny, BUDGET, NEVER_HOLDS, "continue", review="undecided",
                          review_timeout_s=900)
    cmd = [sys.executable, "-m", "stagewise.cli", "run", str(recipe), "--stages", "sft",
           *sets(f"workdir={tmp_path / 'work'}", f"model.from={tiny_pretrain.checkpoint}"), "--json"]
    (tmp_path / "prefect").mkdir()
    with prefect_server(tmp_path / "prefect") as (api, env):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(env, CI="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            run, flow_run_ids = None, set()
            for answer in answers:
                run = paused_run(api, proc, after_key=run and run["state"]["state_details"]["pause_key"])
                flow_run_ids.add(run["id"])
                answer_in_prefect_ui(api, run["id"], answer, shot=tmp_path / "form.png" if answer is answers[0] else None)
            out, err = proc.communicate(timeout=900)
        finally:
            proc.kill()
    assert len(flow_run_ids) == 1  # each pause is the SFT flow run's, asked again after an extension
    return proc.returncode, out, err


@pytest.mark.slow
def test_a_person_extends_then_approves_the_gate_and_the_pipeline_goes_on(cli, tiny_pretrain, tmp_path):
    from mlflow import MlflowClient

    code, out, err = reviewed_run(cli, tiny_pretrain, tmp_path, [
        {"Decision": "extend", "Reviewer": "Ada Lovelace"},
        {"Decision": "approve", "Reviewer": "Ada Lovelace", "Comment": "good enough for RL"}])
    assert code == 0, out[-3000:] + err[-5000:]
    summary = json.loads(out[out.index("{"):])
    sft = summary["stages"][0]
    review = sft["gate"]["review"]
    assert (review["decision"], review["by"], review["comment"]) == ("approve", "Ada Lovelace", "good enough for RL")
    assert review["extended_tokens"] == EVERY and sft["gate"]["action"] == "stop"
    assert sft["gate"]["reason"].startswith("approved by Ada Lovelace: budget exhausted at 24576 tokens")
    assert json.loads((Path(sft["checkpoint"]) / "stagewise.json").read_text())["tokens_seen"] == BUDGET + EVERY
    assert "reviewed: approve by Ada Lovelace at " in sft["note"] and "extended 8,192 tokens" in sft["note"]
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    exp = client.get_experiment_by_name(summary["experiment"])
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("stagewise.substage") == "gated"]
    tags = run.data.tags
    assert (tags["stagewise.review.decision"], tags["stagewise.review.by"]) == ("approve", "Ada Lovelace")
    assert tags["stagewise.review.extended_tokens"] == str(EVERY) and tags["stagewise.review.proposed"] == "stop"


@pytest.mark.slow
def test_a_person_stops_the_pipeline_at_the_gate(cli, tiny_pretrain, tmp_path):
    code, out, err = reviewed_run(cli, tiny_pretrain, tmp_path, [
        {"Decision": "stop", "Reviewer": "Bob", "Comment": "exact match | never moved"}])
    assert code == 1, out[-3000:] + err[-5000:]
    error = json.loads(out[out.index("{"):])["error"]
    assert "GateFailed: stage sft/gated: gate failed: stopped by Bob at the gate (exact match | never moved)" in error
