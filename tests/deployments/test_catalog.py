"""The deployments `stagewise serve` registers: names, default parameters, the weekly schedule.

Built without a server (RunnerDeployment objects are plain data until applied); the e2e test
tests/e2e/test_deployments.py registers them with a real one.
"""

from __future__ import annotations

from pathlib import Path

from stagewise.deployments.catalog import (
    ABLATE,
    DATA_BUILD,
    NIGHTLY,
    NIGHTLY_CRON,
    PIPELINE,
    PROMOTE,
    WEEKLY,
    build_deployments,
    stage_selections,
)
from stagewise.flows.deployed import check_request
from stagewise.flows.registry import REGISTRY

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def test_one_deployment_for_the_pipeline_the_schedule_and_each_stage():
    everything = [d.name for d in build_deployments(TINY)]
    assert everything == [PIPELINE, WEEKLY, *(s.name for s in REGISTRY), PROMOTE, NIGHTLY, ABLATE, DATA_BUILD]
    made = {d.name: d for d in build_deployments(TINY) if d.name not in (PROMOTE, NIGHTLY, ABLATE, DATA_BUILD)}
    assert {d.flow_name for d in made.values()} == {"stagewise-recipe"}
    assert {d.entrypoint for d in made.values()} == {"stagewise.flows.deployed.run_recipe_flow"}  # importable from any directory
    assert all(d.parameters["recipe"] == str(TINY.resolve()) for d in made.values())
    assert "stages" not in made[PIPELINE].parameters and not made[PIPELINE].schedules
    assert all(d.enforce_parameter_schema for d in made.values())


def test_the_nightly_evaluation_is_scheduled_only_with_schedules():
    nightly = {d.name: d for d in build_deployments(TINY)}[NIGHTLY]
    assert nightly.flow_name == "nightly-eval" and nightly.entrypoint == "stagewise.flows.nightly_eval.evaluate_latest_flow"
    assert [s.schedule.cron for s in nightly.schedules] == [NIGHTLY_CRON]
    assert not {d.name: d for d in build_deployments(TINY, schedule=False)}[NIGHTLY].schedules


def test_the_data_build_runs_its_own_flow_on_the_recipe_unscheduled():
    built = {d.name: d for d in build_deployments(TINY)}[DATA_BUILD]
    assert built.flow_name == "data-build" and built.entrypoint == "stagewise.flows.data_build.data_build_flow"
    assert built.parameters == {"recipe": str(TINY.resolve())} and not built.schedules


def test_the_weekly_deployment_has_its_cron_and_no_schedule_leaves_it_out():
    weekly = {d.name: d for d in build_deployments(TINY, cron="30 2 * * 1")}[WEEKLY]
    assert [s.schedule.cron for s in weekly.schedules] == ["30 2 * * 1"]
    assert WEEKLY not in {d.name for d in build_deployments(TINY, schedule=False)}


def test_each_stage_alone_runs_with_what_it_reads_and_passes_the_checks(tmp_path):
    picks = stage_selections()
    assert picks["pretrain"] == ["pretrain"] and picks["merge"] == ["pretrain", "merge"]
    for stage, stages in picks.items():
        assert stages[-1] == stage
        assert check_request(str(TINY), stages, [f"workdir={tmp_path}"])[1] == stages


def test_the_ablation_deployment_offers_the_stages_an_ablation_can_run():
    from typing import get_args

    from stagewise.flows.ablate_plan import ablatable
    from stagewise.flows.deployed import AblatableStage

    ablate = {d.name: d for d in build_deployments(TINY)}[ABLATE]
    assert ablate.flow_name == "stagewise-ablation" and ablate.entrypoint == "stagewise.flows.deployed.ablate_recipe_flow"
    assert ablate.parameters == {"recipe": str(TINY.resolve())}
    assert list(get_args(AblatableStage)) == ablatable()
    from prefect.utilities.callables import parameter_schema

    from stagewise.flows.deployed import ablate_recipe_flow

    form = parameter_schema(ablate_recipe_flow.fn)  # what the UI's form is built from
    assert {"stage", "variants", "budget", "start", "parallel", "overrides"} <= set(form.properties)
    assert form.required == ["recipe", "stage", "variants"]
    assert ablate.enforce_parameter_schema


def test_the_ablation_flow_refuses_a_bad_variant_before_any_work(tmp_path, open_forms):
    import pytest

    from stagewise.data.errors import BadInput
    from stagewise.flows.deployed import ablate_recipe_flow

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    with pytest.raises(BadInput, match="--variant hot"):
        ablate_recipe_flow.fn(str(TINY), "sft", ["a", "hot:stages.sft.stages[0].optimizer.lr=0.01"],
                              start=str(tmp_path / "ckpt"), overrides=[f"workdir={tmp_path}/w"])
    assert not (tmp_path / "w").exists()
