"""Every Prefect deployment of stagewise, defined here in Python (there is no prefect.yaml).

All of them run one flow, flows/deployed.py `run_recipe_flow` (recipe path, stages, `--set`
overrides, resume, force: run despite the recipe doctor's errors), so the Prefect UI shows one form everywhere:

    stagewise-recipe/pipeline        the whole recipe, or the stages picked in the form
    stagewise-recipe/weekly          the same, on a cron schedule (default Sundays 03:00 UTC)
    stagewise-recipe/<stage>         one stage, with the stages it reads (merge: pretrain,merge;
                                     a finished, unchanged pretraining is reused, not retrained)
    stagewise-promote/promote        move <stage>-champion to the run a cutoff rule picks (flows/promote.py)
    stagewise-ablation/ablate        one stage once per variant, compared (flows/deployed.py
                                     `ablate_recipe_flow`: the variants, budget and start in the form)
    nightly-eval/nightly-eval        the newest registered checkpoint on the recipe's suites, nightly
                                     (flows/nightly_eval.py; scheduled with --schedule)
    data-build/data-build            the recipe's sources as Megatron indexed shards, in process or on
                                     Ray (flows/data_build.py), logged to an MLflow run `data-build`
    stagewise-promote/promote        cutoffs as a job (flows/promote.py): move `<stage>-champion` to
                                     the stage checkpoint a cutoff rule picks; the form's experiment and
                                     MLflow store default to the recipe's, the rule file is asked for

`stagewise serve` registers these with the server at PREFECT_API_URL and runs their flow runs
as local processes (the default process execution of `serve`); the recipe given to it is each
deployment's default `recipe` parameter, changeable per run in the form.
"""

from __future__ import annotations

from pathlib import Path

from prefect.client.schemas.schedules import CronSchedule
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from pydantic import ValidationError

from stagewise.data.errors import BadInput
from stagewise.flows.data_build import data_build_flow
from stagewise.flows.deployed import ablate_recipe_flow, run_recipe_flow
from stagewise.flows.nightly_eval import evaluate_latest_flow
from stagewise.flows.pipeline import tracker_for
from stagewise.flows.promote import promote_flow
from stagewise.flows.registry import REGISTRY
from stagewise.recipe import load_recipe

WEEKLY_CRON = "0 3 * * 0"
"""Sundays at 03:00 UTC: a full pipeline run a week."""

PIPELINE, WEEKLY, PROMOTE, NIGHTLY, ABLATE, DATA_BUILD = (
    "pipeline", "weekly", "promote", "nightly-eval", "ablate", "data-build")
NIGHTLY_CRON = "0 2 * * *"
"""Every night at 02:00 UTC: the newest registered checkpoint scored on the recipe's suites."""


def stage_selections() -> dict[str, list[str]]:
    """Each registered stage alone, with the stages it reads from the same run (registry order)."""
    order = [s.name for s in REGISTRY]
    return {s.name: [n for n in order if n in {*s.needs, s.name}] for s in REGISTRY}


def check_cron(cron: str) -> str:
    """`cron` when Prefect can schedule it; BadInput naming `--cron` otherwise."""

    try:
        CronSchedule(cron=cron)
    except ValidationError as e:
        raise BadInput(f"--cron {cron!r}: not a cron schedule ({e.errors()[0]['msg']}); e.g. {WEEKLY_CRON!r}") from None
    return cron


def build_deployments(recipe: str | Path, schedule: bool = True, cron: str = WEEKLY_CRON) -> list[RunnerDeployment]:
    """The deployments for `recipe` (its absolute path is the default parameter); the weekly one only with `schedule`."""
    default = {"recipe": str(Path(recipe).expanduser().resolve())}

    def deploy(name: str, description: str, **kwargs) -> RunnerDeployment:
        return run_recipe_flow.to_deployment(
            name=name, description=description, tags=["stagewise"], entrypoint_type=EntrypointType.MODULE_PATH,
            **kwargs,
        )

    made = [deploy(PIPELINE, "Run a recipe's stages (all of them when none are picked).", parameters=default)]
    if schedule:
        made.append(deploy(WEEKLY, f"The recipe's full pipeline on a schedule (cron {cron!r}, UTC).",
                           parameters=default, cron=check_cron(cron)))
    for stage, stages in stage_selections().items():
        made.append(deploy(stage, f"The {stage} stage alone (runs {', '.join(stages)}; finished stages are reused).",
                           parameters={**default, "stages": stages}))
    made.append(promotion_deployment(recipe))
    made.append(evaluate_latest_flow.to_deployment(
        name=NIGHTLY, description="Score the newest registered checkpoint on the recipe's eval suites.",
        tags=["stagewise"], entrypoint_type=EntrypointType.MODULE_PATH, parameters=default,
        **({"cron": NIGHTLY_CRON} if schedule else {})))
    made.append(ablate_recipe_flow.to_deployment(
        name=ABLATE, description="Run one stage once per variant (NAME or NAME:KEY=VALUE) and compare them.",
        tags=["stagewise"], entrypoint_type=EntrypointType.MODULE_PATH, parameters=default))
    made.append(data_build_flow.to_deployment(
        name=DATA_BUILD, description="Build the recipe's sources as Megatron indexed shards (in process or on Ray), "
        "logged to an MLflow run data-build.",
        tags=["stagewise"], entrypoint_type=EntrypointType.MODULE_PATH, parameters=default))
    return made


def promotion_deployment(recipe: str | Path) -> RunnerDeployment:
    """The cutoff-promotion flow, its experiment and MLflow store defaulting to the recipe's (unscheduled:
    it needs a rule file; add a schedule with one in the UI to run it after each weekly pipeline)."""
    loaded = load_recipe(recipe)
    tracker = tracker_for(loaded.recipe, Path(loaded.recipe.workdir).resolve())
    return promote_flow.to_deployment(
        name=PROMOTE, description="Move <stage>-champion to the stage checkpoint that passes a cutoff rule best.",
        tags=["stagewise"], entrypoint_type=EntrypointType.MODULE_PATH,
        parameters={"experiment": tracker.experiment, "stage": "pretrain", "tracking_uri": tracker.uri},
    )
