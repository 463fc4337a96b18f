"""`stagewise check` and the doctor in front of `stagewise run`: exit codes, located findings, refusal before work."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stagewise.cli import app

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
runner = CliRunner()

BROKEN = """\
base: {tiny}
name: broken
workdir: {workdir}
stages:
  sft:
    stages:
      - name: stage1
        tokens: 983_040
        seq_length: 512
        global_batch: 4
        micro_batch: 4
        optimizer: {{lr: 5.0e-3}}
        blend: {{weights: {{arithmetic: 1}}}}
  rl:
    filter: null
  quantize:
    pins: [{{pattern: lm_head, format: nvfp4}}]
"""
"""Two errors (an SFT LR above pretraining's peak, lm_head pinned to NVFP4) and two warnings (one
domain on an MoE model, RL without a difficulty filter), each at its own line."""
WARNED = "base: {tiny}\nname: warned\nworkdir: {workdir}\nstages:\n  rl:\n    filter: null\n"


def recipe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text.format(tiny=TINY, workdir=tmp_path / "work"))
    return path


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_a_recipe_broken_several_ways_exits_2_naming_each_field_and_line(tmp_path):
    path = recipe(tmp_path, BROKEN)
    result = invoke("check", str(path))
    assert result.exit_code == 2, result.output
    for field, line in (("stages.sft.stages[0].optimizer.lr", 12), ("stages.sft.stages[0].blend.weights.arithmetic", 13),
                        ("stages.rl.filter", 15), ("stages.quantize.pins[0]", 17)):
        assert f"{field} ({path}:{line})" in result.output, (field, result.output)
    assert "2 error(s), 2 warning(s)" in result.output


def test_json_lists_the_findings_with_their_counts(tmp_path):
    result = invoke("check", str(recipe(tmp_path, BROKEN)), "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 2 and (data["errors"], data["warnings"]) == (2, 2)
    assert [f["rule"] for f in data["findings"]] == ["finetune-lr", "moe-narrow-blend", "rl-filter", "quantize-sensitive"]
    assert set(data["findings"][0]) == {"rule", "severity", "field", "where", "message", "value", "reference"}
    assert data["findings"][0]["value"] == 5e-3 and "Nemotron 3 Super" in data["findings"][0]["reference"]


def test_warnings_exit_0_and_2_with_strict(tmp_path):
    path = recipe(tmp_path, WARNED)
    result = invoke("check", str(path))
    assert result.exit_code == 0 and f"warning: stages.rl.filter ({path}:6)" in result.output
    assert invoke("check", str(path), "--strict").exit_code == 2
    assert invoke("check", str(TINY), "--strict").exit_code == 0  # the shipped recipe: no findings at all


def test_set_overrides_are_checked_and_cited(tmp_path):
    result = invoke("check", str(TINY), "--set", f"workdir={tmp_path}", "--set", "stages.rl.optimizer.lr=4e-3")
    assert result.exit_code == 2 and "(--set stages.rl.optimizer.lr=4e-3)" in result.output
    bad = invoke("check", str(TINY), "--set", "stages.rl.optimizer.lr=-1")
    assert bad.exit_code == 2 and "stages.rl.optimizer.lr" in bad.output  # invalid, not advice: the loader's message


def test_help_teaches_every_rule_with_examples():
    from stagewise.recipe.doctor import rule_name, rules

    result = invoke("check", "--help")
    assert result.exit_code == 0 and "Example:\n" in result.output and "stagewise check recipes/tiny.yaml" in result.output
    for rule in rules():
        assert f"  {rule_name(rule)}: " in result.output


@pytest.fixture
def pipeline(monkeypatch):
    """flows.pipeline replaced by a recorder: where Prefect and training would start."""
    calls = []
    module = types.ModuleType("stagewise.flows.pipeline")

    def run_pipeline(loaded, stages=None, resume=False, on_start=None):
        calls.append(stages)
        return {"recipe": loaded.recipe.name, "workdir": "/w", "tracking_uri": "sqlite:////w/m.db",
                "experiment": "e", "runtime": {"device": "cpu", "precision": "fp32"}, "stages": [],
                "mlflow_run_url": "http://127.0.0.1:5000/#/experiments/1/runs/0"}

    module.run_pipeline = run_pipeline
    monkeypatch.setitem(sys.modules, "stagewise.flows.pipeline", module)
    return calls


def test_run_refuses_a_broken_recipe_before_any_work_unless_forced(tmp_path, pipeline):
    path = recipe(tmp_path, BROKEN)
    result = invoke("run", str(path))
    assert result.exit_code == 2 and pipeline == [] and not (tmp_path / "work").exists()
    assert "the recipe doctor found 2 error(s)" in result.output and "--force" in result.output
    assert f"stages.quantize.pins[0] ({path}:17)" in result.output
    assert f"warning: stages.rl.filter ({path}:15)" in result.output
    assert invoke("run", str(path), "--force", "--json").exit_code == 0 and pipeline == [None]


def test_run_judges_only_the_stages_it_runs(tmp_path, pipeline):
    path = recipe(tmp_path, BROKEN)
    result = invoke("run", str(path), "--stages", "pretrain,rl")  # the SFT and quantize errors do not run
    assert result.exit_code == 0, result.output
    assert pipeline == [["pretrain", "rl"]] and "warning: stages.rl.filter" in result.output


def test_demo_passes_the_doctor(pipeline):
    result = invoke("demo", "--json")
    assert result.exit_code == 0, result.output
    assert pipeline == [None] and "warning:" not in result.output and "error:" not in result.output
