"""The deployments `stagewise serve` registers: names, default parameters, the weekly schedule.

Built without a server (RunnerDeployment objects are plain data until applied); the e2e test
tests/e2e/test_deployments.py registers them with a real one.
"""

from __future__ import annotations

from pathlib import Path

from deployments.catalog import NIGHTLY, NIGHTLY_CRON, PIPELINE, PROMOTE, WEEKLY, build_deployments, stage_selections
from flows.deployed import check_request
from flows.registry import REGISTRY

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def test_one_deployment_for_the_pipeline_the_schedule_and_each_stage():
    everything = [d.name for d in build_deployments(TINY)]
    assert everything == [PIPELINE, WEEKLY, *(s.name for s in REGISTRY), PROMOTE, NIGHTLY]
    made = {d.name: d for d in build_deployments(TINY) if d.name not in (PROMOTE, NIGHTLY)}
    assert {d.flow_name for d in made.values()} == {"stagewise-recipe"}
    assert {d.entrypoint for d in made.values()} == {"flows.deployed.run_recipe_flow"}  # importable from any directory
    assert all(d.parameters["recipe"] == str(TINY.resolve()) for d in made.values())
    assert "stages" not in made[PIPELINE].parameters and not made[PIPELINE].schedules
    assert all(d.enforce_parameter_schema for d in made.values())


def test_the_nightly_evaluation_is_scheduled_only_with_schedules():
    nightly = {d.name: d for d in build_deployments(TINY)}[NIGHTLY]
    assert nightly.flow_name == "nightly-eval" and nightly.entrypoint == "flows.nightly_eval.evaluate_latest_flow"
    assert [s.schedule.cron for s in nightly.schedules] == [NIGHTLY_CRON]
    assert not {d.name: d for d in build_deployments(TINY, schedule=False)}[NIGHTLY].schedules


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
