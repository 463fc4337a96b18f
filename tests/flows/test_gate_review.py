"""A person at the gate: what a review does to the gate's decision, and what it records and shows.

The pause itself, against a real `prefect server`, is tested in tests/flows/test_gate_review_server.py
(timeout, resume through the API) and through the Prefect UI in tests/e2e/test_gate_review_ui.py."""

from __future__ import annotations

import re

from stagewise.eval.gates import GateConfig, decide
from stagewise.flows.closing_table import closing_rows, render
from stagewise.flows.gate_review import applied, clean, evidence_markdown, pause_key, review_tags, review_text
from stagewise.refs import StageResult, StageSummary

NEVER = {"all": [{"metric": "eval/x/exact_match", "op": ">=", "value": 0.9}], "eval_every_tokens": 100}
HISTORY = {"eval/x/exact_match": [(1, 100, 0.2), (2, 200, 0.3)]}


def gate(**kw) -> GateConfig:
    return GateConfig.model_validate({**NEVER, **kw})


def test_the_budget_running_out_without_the_rule_is_undecided_and_asks_only_there():
    g = gate(review="undecided")
    early = decide(g, HISTORY, tokens_seen=200, budget_exhausted=False).to_dict()
    out = decide(g, HISTORY, tokens_seen=200, budget_exhausted=True).to_dict()
    assert early["action"] == "continue" and not early["undecided"] and not g.asks_person(early)
    assert out["action"] == "stop" and out["undecided"] and g.asks_person(out)
    failing = decide(gate(review="undecided", on_budget_exhausted="fail"), HISTORY, tokens_seen=200, budget_exhausted=True)
    assert failing.action == "fail" and failing.undecided
    held = decide(gate(review="undecided", all=[{"metric": "eval/x/exact_match", "op": ">=", "value": 0.25}]),
                  HISTORY, tokens_seen=200, budget_exhausted=True).to_dict()
    assert held["held"] and not held["undecided"]
    assert not gate(review="undecided").asks_person(held) and gate(review="always").asks_person(held)
    assert not gate().asks_person(out)  # review: never (the default)


def test_always_asks_at_every_stop_or_fail_never_at_continue():
    g = gate(review="always")
    assert [g.asks_person({"action": a}) for a in ("continue", "stop", "fail")] == [False, True, True]


def decision(action="stop", **kw):
    return {"action": action, "reason": "budget exhausted at 200 tokens, rule not held", "step": 2, "tokens_seen": 200,
            "held": False, "undecided": True, "evidence": {}, **kw}


def review(answer, by="Ada", comment="", extended=0):
    return {"decision": answer, "by": by, "comment": comment, "at": "2026-12-06T23:41:00+00:00", "proposed": "stop",
            "extend_tokens": 0, "extended_tokens": extended}


def test_approve_keeps_a_stop_and_turns_a_fail_into_handing_on_the_last_checkpoint():
    out = applied(decision(), review("approve"))
    assert out["action"] == "stop" and out["step"] == 2 and out["reason"].startswith("approved by Ada: budget")
    over = applied(decision("fail"), review("approve"))
    assert over["action"] == "stop" and over["step"] is None and "approved by Ada over: budget" in over["reason"]
    assert over["review"]["decision"] == "approve"


def test_stop_fails_the_stage_naming_who_and_why_and_a_timeout_leaves_the_gates_decision():
    out = applied(decision(), review("stop", by="Bob", comment="loss is flat"))
    assert out["action"] == "fail" and out["reason"] == "stopped by Bob at the gate (loss is flat)"
    kept = applied(decision("fail"), review("timeout", by="timeout"))
    assert kept["action"] == "fail" and kept["reason"] == decision()["reason"] and kept["review"]["by"] == "timeout"


def test_form_text_is_cleaned_before_it_is_recorded():
    assert clean("Ada\x00 \x1b[31mLovelace\n\t(lead)\x7f", 80) == "Ada [31mLovelace (lead)"
    assert clean("x" * 1000, 80) == "x" * 80


def test_the_evidence_escapes_recipe_text_inside_its_table():
    d = decision(evidence={"conditions": [{"metric": "eval/a|b`c\nd", "group": "all", "current": 0.25, "op": ">=",
                                           "threshold": 0.5, "holds": False}],
                           "guards": [{"metric": "eval/g", "baseline": "start", "drop": 0.01, "max_drop": 0.05,
                                       "violated": False}]})
    md = evidence_markdown("sft/stage1", d, "http://mlflow/#/runs/1", 1000, 60, 100)
    row = next(line for line in md.splitlines() if "eval/a" in line)
    assert row == "| `eval/a\\|b'c d` (all) | 0.25 | >= 0.5 | no |"
    assert "| guard `eval/g`: drop from start | 0.01 | <= 0.05 | yes |" in md
    assert "The gate proposes **stop**" in md and "[The stage's MLflow run](http://mlflow/#/runs/1)" in md
    assert "Trained 200 tokens of a 1,000-token budget" in md and "(default 100)" in md and "60 s" in md


def test_a_review_is_tagged_on_the_run_and_shown_in_the_closing_table():
    r = review("approve", extended=8192)
    tags = review_tags(r)
    assert tags["stagewise.review.decision"] == "approve" and tags["stagewise.review.by"] == "Ada"
    assert tags["stagewise.review.extended_tokens"] == "8192" and "stagewise.review.extend_tokens" not in tags
    assert review_text(r) == "reviewed: approve by Ada at 2026-12-06T23:41:00+00:00, extended 8,192 tokens"
    result = StageResult(stage="pretrain", checkpoint="/c", run_id="r1", gate={**decision(), "review": r},
                         summary=StageSummary(metric="eval/validation/loss", before=3.0, after=2.5, tokens=8192))
    rows = closing_rows([result])
    assert rows[0]["review"] == r
    assert "[gate reviewed: approve by Ada at 2026-12-06T23:41:00+00:00, extended 8,192 tokens]" in render(rows)
    noted = result.model_copy(update={"summary": result.summary.model_copy(update={"note": review_text(r)})})
    assert render(closing_rows([noted])).count("reviewed:") == 1  # SFT's note already says it: not twice


def test_each_gate_pauses_under_its_own_key():
    """Prefect hands a pause whose key already fired in the flow run that pause's answer: SFT's sub-stages
    share a flow run and may stop at the same token count, so the key names the stage too."""
    keys = {pause_key(s, 983_040) for s in ("sft/stage1", "sft/stage2", "sft/stage_1", "sft/stage-1")}
    assert len(keys) == 4 and pause_key("sft/stage1", 983_040) != pause_key("sft/stage1", 991_232)
    assert all(re.fullmatch(r"[a-z0-9-]+", k) for k in keys)  # what Prefect accepts in an input key
    assert pause_key("sft/Étape 1", 5).startswith("gate-sft-tape-1-")
