"""The doctor's gate-review-unreachable rule: a gate a person reviews, in a run with no Prefect server
whose UI they could answer on, is a warning naming the field and the way out."""

from __future__ import annotations

from pathlib import Path

from stagewise.recipe import load_recipe
from stagewise.recipe.doctor import diagnose, failing

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"
REVIEWED = "stages.sft.stages[0].gate.review=undecided"


def findings(tmp_path: Path, *sets: str) -> list:
    loaded = load_recipe(TINY, [f"workdir={tmp_path / 'work'}", *sets])
    return [f for f in diagnose(loaded) if f.rule == "gate-review-unreachable"]


def test_a_reviewed_gate_without_a_prefect_server_is_a_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    (f,) = findings(tmp_path, REVIEWED, "stages.sft.stages[0].gate.review_timeout_s=900")
    assert (f.field, f.severity, f.stage, f.value) == ("stages.sft.stages[0].gate.review", "warning", "sft", 900)
    assert "waits up to 900 s" in f.message and "PREFECT_API_URL" in f.message and "prefect server start" in f.message
    assert failing([f]) == []  # a warning: the run goes on, and the gate's own decision stands at the timeout
    assert f.where == f"--set {REVIEWED}"


def test_with_a_server_or_without_review_there_is_nothing_to_say(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert findings(tmp_path, REVIEWED) == []
    monkeypatch.delenv("PREFECT_API_URL")
    assert findings(tmp_path) == []  # the demo's gate decides alone
