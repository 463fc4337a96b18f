"""Recipes by name: `stagewise run tiny` works without a checkout to point a path at.

Every command that takes a recipe resolves it the same way (recipe/shipped.py `resolve_recipe`):
an existing file wins, then a shipped recipe's name, else exit 2 naming the shipped recipes.
Each test runs from an empty directory, so nothing is found through a checkout's recipes/ folder.
The pipeline, the ablation planner and the deployments are replaced by recorders: these tests
are about which file a command was given, not about training.
"""

from __future__ import annotations

import json
import sys
import types
from importlib.resources import files
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stagewise.cli import app
from stagewise.recipe.errors import BadInput
from stagewise.recipe.shipped import resolve_recipe, shipped_names, shipped_recipe

runner = CliRunner()
SHIPPED = Path(str(files("stagewise") / "recipes"))

LOCAL_RECIPE = """\
name: local-not-shipped
workdir: {workdir}
tokenizer: {{vocab_size: 300}}
data:
  world: {{facts: 40, arithmetic: 40, stdlib_files: 0, retrieval: 0, noisy: 20}}
  sources:
    - {{name: facts, path: "@world/facts.jsonl", quality: high}}
stages:
  pretrain:
    tokens: 8192
    seq_length: 32
    global_batch: 4
    micro_batch: 2
    phases:
      - {{name: only, until: 1.0, blend: {{facts: 1}}}}
"""


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(autouse=True)
def away_from_the_checkout(tmp_path, monkeypatch):
    """Run every test from an empty directory: a name must not be found as ./recipes/<name>."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def fake_pipeline(monkeypatch):
    """flows.pipeline replaced by a recorder of the loaded recipe (no Prefect, no training)."""
    calls = []
    module = types.ModuleType("stagewise.flows.pipeline")

    def run_pipeline(loaded, stages=None, resume=False, on_start=None):
        calls.append(loaded)
        return {"recipe": loaded.recipe.name, "workdir": str(loaded.recipe.workdir), "tracking_uri": "sqlite:////w/mlflow.db",
                "experiment": loaded.recipe.name, "runtime": {"device": "cpu", "precision": "fp32"}, "stages": [],
                "mlflow_run_url": "http://127.0.0.1:5000/#/experiments/1/runs/0"}

    module.run_pipeline = run_pipeline
    monkeypatch.setitem(sys.modules, "stagewise.flows.pipeline", module)
    return calls


# --------------------------------------------------------------------------- the lookup

def test_the_shipped_recipes_are_listed_by_stem_and_found_in_the_package():
    assert {"tiny", "nemotron-3-nano-4b", "finetune"} <= set(shipped_names())
    assert shipped_names() == sorted(shipped_names())
    tiny = shipped_recipe("tiny")
    assert tiny is not None and tiny.is_file() and tiny.parent == SHIPPED


@pytest.mark.parametrize("name", ["tiny.yaml", "recipes/tiny", "../recipes/tiny", "no-such-recipe", ""])
def test_only_a_listed_stem_is_a_shipped_name(name):
    assert shipped_recipe(name) is None


def test_a_name_resolves_and_an_existing_path_wins(tmp_path):
    assert resolve_recipe("tiny") == shipped_recipe("tiny")
    local = tmp_path / "tiny"
    local.write_text(LOCAL_RECIPE.format(workdir=tmp_path / "work"))
    assert resolve_recipe("tiny") == Path("tiny")  # ./tiny is a file: it is the recipe meant
    assert resolve_recipe(local) == local


def test_an_unknown_name_is_bad_input_naming_the_shipped_recipes():
    with pytest.raises(BadInput) as caught:
        resolve_recipe("tiny-typo")
    message = str(caught.value)
    assert "recipe file not found: tiny-typo" in message
    assert all(name in message for name in shipped_names())


# --------------------------------------------------------------------------- the commands

def test_recipe_show_by_name_prints_the_shipped_file():
    result = invoke("recipe", "show", "tiny", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert Path(shown["path"]) == shipped_recipe("tiny").resolve() and shown["recipe"]["name"] == "tiny"


@pytest.mark.parametrize("name", ["nemotron-3-nano-4b", "finetune"])
def test_a_shipped_recipe_finds_its_base_next_to_it_in_the_package(name):
    """Both say `base: tiny.yaml`: relative paths resolve against the recipe's own directory, which for
    a shipped recipe is the package's recipes folder, not the current one."""
    result = invoke("recipe", "show", name, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["recipe"]["name"] == name


def test_finetune_checks_by_name_and_runs_only_from_the_teams_checkpoint(tmp_path):
    """finetune.yaml loads and passes the doctor as shipped; its model.from is a placeholder, so a run
    without `--set model.from=PATH` stops before any work, saying so (the real pipeline: no recorder)."""
    work = f"workdir={tmp_path / 'work'}"
    result = invoke("check", "finetune", "--set", work, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["findings"] == [], result.output
    result = invoke("run", "finetune", "--set", work)
    assert result.exit_code == 2, result.output
    assert ("model.from: /path/to/post-trained-checkpoint is not a checkpoint directory (no config.json); "
            "stages.sft starts there: point it at one, --set model.from=PATH") in result.output
    assert not (tmp_path / "work").exists()  # refused before the workdir, Prefect or MLflow


def test_a_local_file_wins_over_the_shipped_name(tmp_path):
    (tmp_path / "tiny").write_text(LOCAL_RECIPE.format(workdir=tmp_path / "work"))
    result = invoke("recipe", "show", "tiny", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["recipe"]["name"] == "local-not-shipped"


@pytest.mark.parametrize("command", [["recipe", "show"], ["run"], ["check"], ["data", "prepare"]])
def test_an_unknown_name_exits_2_naming_the_shipped_recipes(command):
    result = invoke(*command, "tiny-typo")
    assert result.exit_code == 2, result.output
    assert "recipe file not found: tiny-typo" in result.output and "Traceback" not in result.output
    assert all(name in result.output for name in shipped_names())


def test_an_unknown_name_with_json_is_one_json_error():
    result = invoke("recipe", "show", "tiny-typo", "--json")
    error = json.loads(result.stdout)
    assert result.exit_code == 2 and error["exit_code"] == 2 and "shipped: " in error["error"]


def test_run_and_check_take_a_name(fake_pipeline, tmp_path):
    result = invoke("run", "tiny", "--stages", "pretrain", "--set", f"workdir={tmp_path / 'work'}", "--json")
    assert result.exit_code == 0, result.output
    (loaded,) = fake_pipeline
    assert loaded.path == shipped_recipe("tiny").resolve()
    assert loaded.base_dir == SHIPPED.resolve()  # where its relative paths (none: @world/ only) would resolve
    assert all(s.path.startswith("@world/") for s in loaded.recipe.data.sources)
    result = invoke("check", "tiny", "--set", f"workdir={tmp_path / 'work'}", "--json")
    assert result.exit_code == 0, result.output


def test_demo_runs_the_shipped_tiny(fake_pipeline, tmp_path):
    result = invoke("demo", "--set", f"workdir={tmp_path / 'work'}", "--json")
    assert result.exit_code == 0, result.output
    assert [loaded.path for loaded in fake_pipeline] == [shipped_recipe("tiny").resolve()]


def test_ablate_hands_the_planner_the_shipped_file(monkeypatch):
    """ablate passes its RECIPE straight to the planner: the argument itself resolves the name."""
    import stagewise.flows.ablate_plan as ablate_plan

    planned = []

    def plan_ablation(path, *args, **kwargs):
        planned.append(Path(path))
        raise BadInput("planned: stop before training")

    monkeypatch.setattr(ablate_plan, "plan_ablation", plan_ablation)
    result = invoke("ablate", "tiny", "--stage", "pretrain", "--variant", "a", "--variant", "b:seed=2")
    assert result.exit_code == 2 and "planned: stop" in result.output, result.output
    assert planned == [shipped_recipe("tiny")]


@pytest.mark.parametrize("option, expected", [(["--recipe", "nemotron-3-nano-4b"], "nemotron-3-nano-4b"), ([], "tiny")])
def test_serve_takes_a_name_and_defaults_to_the_shipped_tiny(monkeypatch, option, expected):
    """What `serve` hands the deployments: the shipped file (a fake catalog, no Prefect server)."""
    import stagewise.cli.serve as serve

    built = []
    catalog = types.ModuleType("stagewise.deployments.catalog")
    catalog.check_cron = lambda cron: cron

    def build_deployments(recipe, schedule=True, cron=""):
        built.append(Path(recipe))
        raise BadInput("built: stop before serving")

    catalog.build_deployments = build_deployments
    monkeypatch.setitem(sys.modules, "stagewise.deployments.catalog", catalog)
    monkeypatch.setattr(serve, "api_url", lambda: "http://127.0.0.1:4200/api")
    result = invoke("serve", *option)
    assert result.exit_code == 2 and "built: stop" in result.output, result.output
    assert built == [shipped_recipe(expected)]


def test_serve_refuses_an_unknown_name():
    result = invoke("serve", "--recipe", "tiny-typo")
    assert result.exit_code == 2 and "shipped: " in result.output, result.output


def test_the_help_says_a_shipped_name_works():
    for command in (["run"], ["check"], ["recipe", "show"], ["serve"]):
        result = invoke(*command, "--help")
        assert result.exit_code == 0 and "shipped" in result.output and "tiny" in result.output, command
    assert "stagewise run tiny" in invoke("run", "--help").output
    assert "stagewise recipe show tiny" in invoke("recipe", "show", "--help").output
