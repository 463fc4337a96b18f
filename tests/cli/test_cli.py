"""The `stagewise` CLI: help texts, exit codes, JSON output, and the calls it makes.

The pipeline and data preparation are replaced by fakes where the test is about the CLI
(what it passes, how it reports); inspect and a tiny `data prepare` run for real.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stagewise.cli import app

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
runner = CliRunner()

SMALL = """\
name: small-cli
workdir: {workdir}
tokenizer: {{vocab_size: 300}}
data:
  world: {{facts: 40, arithmetic: 40, stdlib_files: 0, retrieval: 0, noisy: 20}}
  sources:
    - {{name: facts, path: "@world/facts.jsonl", quality: high}}
    - {{name: arithmetic, path: "@world/arithmetic.jsonl"}}
    - {{name: noisy, path: "@world/noisy.jsonl", quality: low}}
stages:
  pretrain:
    tokens: 8192
    seq_length: 32
    global_batch: 4
    micro_batch: 2
    phases:
      - {{name: diversity, until: 0.5, blend: {{facts: 1, arithmetic: 1, noisy: 1}}}}
      - {{name: quality, until: 1.0, blend: {{facts: 1}}}}
"""


def small_recipe(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL.format(workdir=tmp_path / "work"))
    return path


def invoke(*args: str, **kw):
    return runner.invoke(app, list(args), **kw)


@pytest.fixture
def fake_pipeline(monkeypatch):
    """Replace flows.pipeline with a recorder (no Prefect, no training)."""
    calls = []
    module = types.ModuleType("stagewise.flows.pipeline")

    def run_pipeline(loaded, stages=None, resume=False, on_start=None):
        calls.append((loaded, stages, resume))
        print("progress chatter from the libraries")
        if loaded.recipe.seed == 666:
            raise RuntimeError("the loss went to NaN at step 3")
        row = {"stage": "pretrain", "metric": "eval/validation/loss", "before": 8.3, "after": 3.0,
               "higher_is_better": False, "tokens": 8192, "seconds": 12.5, "run_id": "abc123", "checkpoint": "/w/ckpt"}
        return {"recipe": loaded.recipe.name, "workdir": "/w", "tracking_uri": "sqlite:////w/mlflow.db",
                "experiment": loaded.recipe.name, "runtime": {"device": "cpu", "precision": "fp32"}, "stages": [row],
                "mlflow_run_id": "f" * 32, "mlflow_run_url": f"http://127.0.0.1:5000/#/experiments/1/runs/{'f' * 32}"}

    module.run_pipeline = run_pipeline
    monkeypatch.setitem(sys.modules, "stagewise.flows.pipeline", module)
    return calls


# --------------------------------------------------------------------------- help

def test_help_lists_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("run", "demo", "inspect", "data", "recipe"):
        assert f"  {command} " in result.output


@pytest.mark.parametrize("command", [["run"], ["demo"], ["inspect"], ["data", "prepare"], ["recipe", "show"], ["recipe", "schema"]])
def test_every_command_help_has_an_example(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0 and re.search(r"Example:\n\s+stagewise ", result.output)


def test_help_does_not_import_heavy_libraries():
    import subprocess

    code = ("import sys; from stagewise.cli import app; from typer.testing import CliRunner; "
            "CliRunner().invoke(app, ['--help']); "
            "print(sorted(m for m in ('torch', 'transformers', 'prefect', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=RECIPES.parent).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- recipe show / schema

def test_recipe_show_prints_resolved_yaml():
    result = invoke("recipe", "show", str(RECIPES / "nemotron-3-nano-4b.yaml"), "--set", "seed=7")
    assert result.exit_code == 0, result.output
    assert "name: nemotron-3-nano-4b" in result.output and "seed: 7" in result.output
    assert "recipe hash " in result.output.splitlines()[0]


def test_recipe_show_json():
    result = invoke("recipe", "show", str(RECIPES / "tiny.yaml"), "--json")
    data = json.loads(result.stdout)
    assert data["recipe"]["stages"]["pretrain"]["seq_length"] == 256 and len(data["hash"]) == 16


def test_recipe_schema_is_json_schema():
    schema = json.loads(invoke("recipe", "schema").stdout)
    assert {"name", "data", "stages", "base"} <= set(schema["properties"])


def test_bad_recipe_exits_2_with_the_message_and_no_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = small_recipe(tmp_path)
    bad.write_text(bad.read_text().replace("micro_batch: 2", "micro_batch: 0"))
    result = invoke("recipe", "show", "small.yaml")
    assert result.exit_code == 2
    assert "error: invalid recipe small.yaml (1 problem):" in result.output
    assert "stages.pretrain.micro_batch: must be > 0 (small.yaml:15)" in result.output
    assert "Traceback" not in result.output


def test_missing_file_and_bad_option_exit_2(tmp_path):
    result = invoke("recipe", "show", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2 and "recipe file not found" in result.output
    assert invoke("recipe", "show", "--no-such-option").exit_code == 2


def test_bad_recipe_with_json_reports_json():
    result = invoke("recipe", "show", str(RECIPES / "tiny.yaml"), "--set", "stages.pretrain.tokens=0", "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 2 and data["exit_code"] == 2 and "stages.pretrain.tokens: must be > 0" in data["error"]


# --------------------------------------------------------------------------- run / demo

def test_run_passes_the_loaded_recipe_and_stages(fake_pipeline, tmp_path):
    recipe = small_recipe(tmp_path)
    result = invoke("run", str(recipe), "--stages", "pretrain", "--resume", "--set", "seed=3", "--json")
    assert result.exit_code == 0, result.output
    (loaded, stages, resume), = fake_pipeline
    assert loaded.recipe.seed == 3 and loaded.path == recipe.resolve() and stages == ["pretrain"] and resume
    assert json.loads(result.stdout)["stages"][0]["checkpoint"] == "/w/ckpt"  # stdout is only the JSON
    assert "progress chatter" in result.stderr


def test_run_ends_with_the_closing_table(fake_pipeline, tmp_path):
    result = invoke("run", str(small_recipe(tmp_path)))
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("pretrain"))
    assert "eval/validation/loss" in row and "8.3 -> 3  (better)" in row and "8,192" in row and "abc123" in row
    # the parent run's own page, and how to serve it
    assert f"The pipeline's MLflow run: http://127.0.0.1:5000/#/experiments/1/runs/{'f' * 32}" in result.stdout
    assert "(after `mlflow ui --backend-store-uri sqlite:////w/mlflow.db`)" in result.stdout


def test_asking_for_cuda_on_a_cpu_machine_exits_2_naming_the_field(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke("run", str(small_recipe(tmp_path)), "--set", "runtime.device=cuda")
    assert result.exit_code == 2, result.output
    assert "runtime.device: cuda was asked for but torch sees no CUDA device" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "work").exists()  # nothing started


def test_run_rejects_stages_the_recipe_lacks_before_running(fake_pipeline, tmp_path):
    result = invoke("run", str(small_recipe(tmp_path)), "--stages", "pretrain,quantize")
    assert result.exit_code == 2 and "the recipe has no stages.quantize block" in result.output
    assert fake_pipeline == []


def test_run_failure_exits_1_traceback_only_with_debug(fake_pipeline, tmp_path):
    recipe = str(small_recipe(tmp_path))
    result = invoke("run", recipe, "--set", "seed=666")
    assert result.exit_code == 1
    assert "RuntimeError: the loss went to NaN at step 3" in result.output and "Traceback" not in result.output
    result = invoke("run", recipe, "--set", "seed=666", "--debug")
    assert result.exit_code == 1 and "Traceback" in result.output
    result = invoke("run", recipe, "--set", "seed=666", env={"STAGEWISE_DEBUG": "1"})
    assert "Traceback" in result.output


def test_demo_runs_the_shipped_tiny_recipe_and_says_where(fake_pipeline):
    result = invoke("demo")
    assert result.exit_code == 0, result.output
    (loaded, stages, _), = fake_pipeline
    assert loaded.path == (RECIPES / "tiny.yaml").resolve() and stages is None
    assert "mlflow ui --backend-store-uri sqlite:////w/mlflow.db" in result.output


# --------------------------------------------------------------------------- data prepare

def test_data_prepare_calls_prepare_data(monkeypatch, tmp_path):
    calls = []
    module = types.ModuleType("stagewise.data.prepare")

    def prepare_data(data, tokenizer, workdir, seed, base_dir, progress=True):
        calls.append((data, tokenizer, workdir, seed, base_dir))
        shards = types.SimpleNamespace(train_tokens=100, val_tokens=5, docs=3)
        return types.SimpleNamespace(root=workdir / "data" / "x", tokenizer_dir=workdir / "tok", digest="d",
                                     reused=False, sources={"facts": shards})

    module.prepare_data = prepare_data
    monkeypatch.setitem(sys.modules, "stagewise.data.prepare", module)
    recipe = small_recipe(tmp_path)
    result = invoke("data", "prepare", str(recipe), "--set", "seed=9")
    assert result.exit_code == 0, result.output
    (data, tokenizer, workdir, seed, base_dir), = calls
    assert seed == 9 and workdir == tmp_path / "work" and base_dir == tmp_path and tokenizer.vocab_size == 300
    assert "facts" in result.output and "100 train tokens" in result.output


def test_data_prepare_for_real(tmp_path):
    result = invoke("data", "prepare", str(small_recipe(tmp_path)), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["sources"]) == {"facts", "arithmetic", "noisy"}
    assert all(s["train_tokens"] > 0 for s in report["sources"].values())
    assert Path(report["tokenizer_dir"]).is_dir()


# --------------------------------------------------------------------------- inspect

def test_inspect_presets_and_a_recipe():
    result = invoke("inspect", "--presets", "--json")
    assert "tiny" in json.loads(result.stdout) and "nemotron-3-nano-4b" in json.loads(result.stdout)
    result = invoke("inspect", str(RECIPES / "tiny.yaml"), "--json", "--seq-length", "128")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert 1_000_000 < report["total_params"] < 3_000_000 and report["vocab_size"] == 4096
    assert report["memory"]["seq_length"] == 128 and report["memory"]["micro_batch"] == 8


def test_inspect_bad_targets_exit_2(tmp_path):
    assert invoke("inspect", "--preset", "nope").exit_code == 2
    result = invoke("inspect", str(tmp_path))
    assert result.exit_code == 2 and "not a checkpoint directory (no config.json)" in result.output
    assert invoke("inspect").exit_code == 2


# --------------------------------------------------------------------------- eval

@pytest.mark.parametrize("command", [["eval"], ["cutoffs"]])
def test_eval_and_cutoffs_help_have_an_example(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0 and re.search(r"Example:\n\s+stagewise ", result.output)


def test_help_does_not_import_lm_eval():
    import subprocess

    code = ("import sys; from stagewise.cli import app; from typer.testing import CliRunner; "
            "CliRunner().invoke(app, ['eval', '--help']); print('lm_eval' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=RECIPES.parent)
    assert out.stdout.strip() == "False"


def eval_recipe(tmp_path: Path) -> Path:
    path = small_recipe(tmp_path)
    path.write_text(path.read_text() + "eval:\n  quick: [world_compare_mc]\n  full: [world]\n")
    return path


@pytest.mark.parametrize("args,message", [
    ([], "give --suite NAME"),
    (["--suite", "quick", "--tasks", "world"], "not both"),
    (["--suite", "quick"], "add --recipe"),
    (["--tasks", " , "], "no task names"),
])
def test_eval_bad_options_exit_2(tiny_checkpoint, args, message):
    result = invoke("eval", str(tiny_checkpoint), *args)
    assert result.exit_code == 2 and message in result.output


def test_eval_unknown_suite_lists_the_recipes_suites(tiny_checkpoint, tmp_path):
    result = invoke("eval", str(tiny_checkpoint), "--suite", "quik", "--recipe", str(eval_recipe(tmp_path)))
    assert result.exit_code == 2 and "did you mean 'quick'" in result.output and "full, quick" in result.output


def test_eval_not_a_checkpoint_exits_2(tmp_path):
    result = invoke("eval", str(tmp_path), "--tasks", "world")
    assert result.exit_code == 2 and "not a checkpoint" in result.output


def test_eval_a_suite_from_the_recipe_json(tiny_checkpoint, tmp_path):
    result = invoke("eval", str(tiny_checkpoint), "--suite", "quick", "--recipe", str(eval_recipe(tmp_path)),
                    "--limit", "3", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"] == ["world_compare_mc"] and report["limit"] == 3
    assert set(report["metrics"]) == {"world_compare_mc/acc", "world_compare_mc/acc_norm"}


def test_eval_tasks_text(tiny_checkpoint):
    result = invoke("eval", str(tiny_checkpoint), "--tasks", "world_arithmetic", "--limit", "2")
    assert result.exit_code == 0, result.output
    assert re.search(r"world_arithmetic/exact_match\s+\d\.\d{4}", result.output)


# --------------------------------------------------------------------------- cutoffs

ACC = "eval/world_arithmetic/exact_match"
LOOKUP = "eval/world_lookup/exact_match"


@pytest.fixture(scope="module")
def cutoff_store(tmp_path_factory):
    """An experiment with two pretrain runs (the rule holds in the first at step 20) and an sft run."""
    from stagewise.store.tracking import STAGE_TAG, Tracker

    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracker = Tracker(uri, "tiny", artifact_root=str(root / "artifacts"))
    runs = []
    for accs in [(0.0, 0.1, 0.35, 0.5), (0.0, 0.05, 0.1, 0.2)]:
        run = tracker.start_run("pretrain", {STAGE_TAG: "pretrain"})
        tracker.log_metrics(run, [(s, s * 4096, {ACC: a, LOOKUP: 0.5 - s / 100}) for s, a in zip((0, 10, 20, 30), accs)])
        runs.append(run)
    tracker.start_run("sft", {STAGE_TAG: "sft"})
    return uri, runs


def rule_file(tmp_path: Path, body: str | None = None) -> Path:
    path = tmp_path / "rule.yaml"
    path.write_text(body or f"all:\n  - {{metric: {ACC}, op: '>=', value: 0.3}}\nguards:\n  - {{metric: {LOOKUP}, max_drop: 0.5}}\n")
    return path


def cutoffs(uri: str, rule: Path, *extra: str, stage: str = "pretrain"):
    return invoke("cutoffs", "--experiment", "tiny", "--stage", stage, "--rule", str(rule), "--tracking-uri", uri, *extra)


def test_cutoffs_json_gives_each_runs_cutoff(cutoff_store, tmp_path):
    uri, (first, second) = cutoff_store
    result = cutoffs(uri, rule_file(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [r["run_id"] for r in runs] == [first, second]
    assert runs[0]["cutoff"] == {"step": 20, "tokens_seen": 81920, "values": {ACC: 0.35, LOOKUP: 0.3}}
    assert runs[1]["cutoff"] is None
    guard = runs[0]["guards"][0]
    assert guard["metric"] == LOOKUP and guard["at_cutoff"] == 0.3 and guard["final"] == pytest.approx(0.2)


def test_cutoffs_text_and_plot(cutoff_store, tmp_path):
    uri, _ = cutoff_store
    plot = tmp_path / "out" / "cutoffs.png"
    result = cutoffs(uri, rule_file(tmp_path), "--plot", str(plot))
    assert result.exit_code == 0, result.output
    assert "rule first held at step 20, 81,920 tokens" in result.output and "rule never held" in result.output
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_cutoffs_reads_the_store_from_the_environment(cutoff_store, tmp_path, monkeypatch):
    uri, _ = cutoff_store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    result = invoke("cutoffs", "--experiment", "tiny", "--stage", "pretrain", "--rule", str(rule_file(tmp_path)), "--json")
    assert result.exit_code == 0 and len(json.loads(result.stdout)["runs"]) == 2


@pytest.mark.parametrize("case,message", [
    ("stage", "no runs of stage 'rl'"),
    ("metric", "nearest: eval/world_arithmetic/exact_match"),
    ("rule_key", "al"),
    ("rule_missing", "rule file not found"),
    ("store", "no MLflow store"),
    ("experiment", "no MLflow experiment 'nope'"),
])
def test_cutoffs_bad_input_exits_2(cutoff_store, tmp_path, case, message):
    uri, _ = cutoff_store
    rule = rule_file(tmp_path)
    args = {"stage": dict(stage="rl")}.get(case, {})
    if case == "metric":
        rule = rule_file(tmp_path, "all:\n  - {metric: eval/world_arithmetc/exact_match, op: '>', value: 0}\n")
    elif case == "rule_key":
        rule = rule_file(tmp_path, f"al:\n  - {{metric: {ACC}, op: '>', value: 0}}\n")
    elif case == "rule_missing":
        rule = tmp_path / "missing.yaml"
    elif case == "store":
        uri = f"sqlite:///{tmp_path / 'none.db'}"
    if case == "experiment":
        result = invoke("cutoffs", "--experiment", "nope", "--stage", "pretrain", "--rule", str(rule), "--tracking-uri", uri)
    else:
        result = cutoffs(uri, rule, **args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    if case == "stage":
        assert "stages there: pretrain, sft" in result.output


def test_cutoffs_skips_a_run_without_the_metrics_and_reports_why(cutoff_store, tmp_path):
    from stagewise.store.tracking import STAGE_TAG, Tracker

    uri, _ = cutoff_store
    tracker = Tracker(uri, "partial")
    good = tracker.start_run("pretrain", {STAGE_TAG: "pretrain"})
    tracker.log_metrics(good, [(0, 0, {ACC: 0.5, LOOKUP: 0.5})])
    empty = tracker.start_run("pretrain", {STAGE_TAG: "pretrain"})
    result = invoke("cutoffs", "--experiment", "partial", "--stage", "pretrain", "--rule", str(rule_file(tmp_path)),
                    "--tracking-uri", uri, "--json")
    assert result.exit_code == 0, result.output
    by_id = {r["run_id"]: r for r in json.loads(result.stdout)["runs"]}
    assert by_id[good]["cutoff"]["step"] == 0 and by_id[good]["error"] is None
    assert by_id[empty]["cutoff"] is None and "is not logged" in by_id[empty]["error"]


def test_eval_on_cuda_without_a_gpu_exits_2(tiny_checkpoint, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = invoke("eval", str(tiny_checkpoint), "--tasks", "world_lookup", "--device", "cuda")
    assert result.exit_code == 2 and "--device: cuda was asked for but torch sees no CUDA device" in result.output
