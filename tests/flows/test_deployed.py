"""The deployed flow refuses bad parameters before any work, with the message `stagewise run` gives.

No Prefect server here: the checks are called directly, and the flow's body through `.fn`
(what a flow run executes), so a failure names the check, not a server.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from stagewise.cli import app
from stagewise.data.errors import BadInput
from stagewise.flows.deployed import check_request, run_recipe_flow
from stagewise.recipe import available_stages

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def _cli_message(*args: str) -> str:
    """What `stagewise run` prints for the same input (exit 2), without its `error: ` prefix."""
    result = CliRunner().invoke(app, ["run", str(TINY), *args])
    assert result.exit_code == 2, result.output
    return result.output.strip().removeprefix("error: ")


@pytest.mark.parametrize("overrides, stages, where", [
    (["stages.pretrain.tokenz=5"], None, "stages.pretrain.tokenz: unknown key; did you mean tokens? (--set stages.pretrain.tokenz=5)"),
    (["stages.pretrain.tokens=abc"], ["pretrain"], "stages.pretrain.tokens: must be a valid integer"),
    ([], ["pretrian"], "--stages: unknown stage 'pretrian'"),
    (["stages.quantize=null"], ["quantize"], "--stages: the recipe has no stages.quantize block"),
])
def test_bad_parameters_raise_the_located_message_the_cli_gives(tmp_path, overrides, stages, where):
    overrides = [f"workdir={tmp_path / 'w'}", *overrides]
    with pytest.raises(BadInput) as caught:
        check_request(str(TINY), stages, overrides)
    assert where in str(caught.value)
    cli_args = [a for o in overrides for a in ("--set", o)] + (["--stages", ",".join(stages)] if stages else [])
    assert str(caught.value) == _cli_message(*cli_args)


def test_a_stage_the_recipe_lacks_is_refused(tmp_path):
    recipe = tmp_path / "no_sft.yaml"
    recipe.write_text(f"base: {TINY}\nstages:\n  sft: null\n  distill: null\n")  # distill starts from sft
    with pytest.raises(BadInput, match=r"--stages: the recipe has no stages.sft block"):
        check_request(str(recipe), ["pretrain", "sft"], [])


def test_good_parameters_come_back_in_pipeline_order(tmp_path):
    loaded, chosen = check_request(str(TINY), ["merge", "pretrain"], [f"workdir={tmp_path}", "stages.pretrain.tokens=163840"])
    assert chosen == ["pretrain", "merge"] and loaded.recipe.stages.pretrain.tokens == 163840
    assert check_request(str(TINY), [], [f"workdir={tmp_path}"])[1] is None  # none picked: every stage


def test_the_flow_body_fails_before_any_work(tmp_path, open_forms):
    workdir = tmp_path / "w"
    with pytest.raises(BadInput, match=r"stages.pretrain.tokenz: unknown key"):
        run_recipe_flow.fn(recipe=str(TINY), stages=["pretrain"], overrides=[f"workdir={workdir}", "stages.pretrain.tokenz=5"])
    with pytest.raises(BadInput, match="recipe file not found"):
        run_recipe_flow.fn(recipe=str(tmp_path / "missing.yaml"))
    assert not workdir.exists()


def test_the_form_offers_the_available_stages():
    """The flow's parameter schema (what the UI renders): stages a multi-select of the stage names."""
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(run_recipe_flow).model_dump()
    props = schema["properties"]
    assert schema["required"] == ["recipe"] and props["recipe"]["type"] == "string"
    arrays = [s for s in props["stages"]["anyOf"] if s.get("type") == "array"]
    items = arrays[0]["items"]
    assert items.get("enum") == available_stages(), items
    overrides = [s for s in props["overrides"]["anyOf"] if s.get("type") == "array"][0]
    assert overrides["items"]["type"] == "string"
    assert props["resume"]["type"] == "boolean" and props["resume"]["default"] is False
    assert props["force"]["type"] == "boolean" and props["force"]["default"] is False


def test_the_recipe_doctor_refuses_before_any_work_as_stagewise_run_does(tmp_path, open_forms):
    workdir = tmp_path / "w"
    with pytest.raises(BadInput, match=r"the recipe doctor found errors[\s\S]*stages\.sft\.stages\[0\]\.optimizer\.lr[\s\S]*finetune-lr"):
        run_recipe_flow.fn(recipe=str(TINY), stages=["sft"],
                           overrides=[f"workdir={workdir}", "stages.sft.stages[0].optimizer.lr=0.05"])
    assert not workdir.exists()
