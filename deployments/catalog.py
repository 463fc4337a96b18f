"""Every Prefect deployment of stagewise, defined here in Python (there is no prefect.yaml).

All of them run one flow, flows/deployed.py `run_recipe_flow` (recipe path, stages, `--set`
overrides, resume), so the Prefect UI shows one form everywhere:

    stagewise-recipe/pipeline        the whole recipe, or the stages picked in the form
    stagewise-recipe/weekly          the same, on a cron schedule (default Sundays 03:00 UTC)
    stagewise-recipe/<stage>         one stage, with the stages it reads (merge: pretrain,merge;
                                     a finished, unchanged pretraining is reused, not retrained)

`stagewise serve` registers these with the server at PREFECT_API_URL and runs their flow runs
as local processes (the default process execution of `serve`); the recipe given to it is each
deployment's default `recipe` parameter, changeable per run in the form.
"""

from __future__ import annotations

from pathlib import Path

from prefect.deployments.runner import EntrypointType, RunnerDeployment

from flows.deployed import run_recipe_flow

WEEKLY_CRON = "0 3 * * 0"
"""Sundays at 03:00 UTC: a full pipeline run a week."""

PIPELINE, WEEKLY = "pipeline", "weekly"


def stage_selections() -> dict[str, list[str]]:
    """Each registered stage alone, with the stages it reads from the same run (registry order)."""
    from flows.registry import REGISTRY

    order = [s.name for s in REGISTRY]
    return {s.name: [n for n in order if n in {*s.needs, s.name}] for s in REGISTRY}


def check_cron(cron: str) -> str:
    """`cron` when Prefect can schedule it; BadInput naming `--cron` otherwise."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    from data.errors import BadInput

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
    return made
