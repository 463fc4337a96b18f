"""`stagewise serve`: register the deployments with a Prefect server and run what it schedules.

This is how a person gets the pipeline into the Prefect UI: start a server, run this, open the
page, press Run on `stagewise-recipe/pipeline` and fill in its form. The deployments are defined
in deployments/catalog.py; this command only checks its recipe and `--cron`, and that the server
named by PREFECT_API_URL answers (bad input, exit 2, when it is unset or silent, since nothing
can be registered), and then serves until interrupted (Ctrl-C or SIGTERM pause the deployments on the way out).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.output import BadInput, guarded


def api_url() -> str:
    """The Prefect API this process talks to (PREFECT_API_URL or the active profile), checked to answer."""
    import httpx
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise BadInput("PREFECT_API_URL is not set: start a server (`prefect server start`) and "
                       "export PREFECT_API_URL=http://127.0.0.1:4200/api")
    try:
        answer = httpx.get(f"{url.rstrip('/')}/health", timeout=10)
        answer.raise_for_status()
    except httpx.HTTPError as e:
        raise BadInput(f"PREFECT_API_URL={url}: the Prefect server does not answer ({type(e).__name__}: {e}); "
                       "is `prefect server start` running?") from None
    return url


@guarded
def serve_cmd(
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="The deployments' default recipe: a YAML file or a shipped recipe's name (default: the shipped tiny)."),
    schedule: bool = typer.Option(True, "--schedule/--no-schedule", help="Also serve the weekly scheduled pipeline run."),
    cron: str = typer.Option("0 3 * * 0", "--cron", help="The weekly deployment's cron schedule (UTC)."),
    pool: Optional[str] = typer.Option(None, "--pool", help="Register the deployments on this Prefect work pool (a process pool is made when missing) and exit; workers started with `prefect worker start --pool NAME` run the flow runs (docs/DEPLOY.md: Kubernetes and Slurm pools)."),
    recipe_root: list[Path] = typer.Option([], "--recipe-root", help="A directory whose recipes (and promotion rule files) a form may name, besides the served recipe's own directory and the shipped recipes; repeatable. A form naming a file elsewhere fails before any work."),
    allow_set: list[str] = typer.Option([], "--allow-set", help="An override key a form may set besides the training knobs open by default (token budgets, steps, learning rates, blend weights, seed); `*` is one path segment, `**` anything: e.g. workdir, 'stages.pretrain.**', '**' (everything). Repeatable. launch, tracking, workdir, base, model.from and data paths stay closed unless opened here."),
) -> None:
    """Register the pipeline's deployments with the Prefect server and run their flow runs.

    Serves stagewise-recipe/pipeline (the form: recipe, stages, --set overrides, resume),
    stagewise-recipe/weekly (the same on a cron schedule; --no-schedule leaves it out), one
    deployment per stage, the cutoff promotion and the nightly evaluation. Flow runs start as
    local processes in this directory (stop with Ctrl-C: the deployments are paused), or, with
    --pool, wherever that work pool's workers run. The server is the one PREFECT_API_URL names.

    What a form may ask is this command's to say: a recipe under the served recipe's directory,
    the shipped recipes or a --recipe-root, and overrides of the default training knobs or of an
    --allow-set pattern; anything else fails the flow run before any work, naming the key.

    \b
    Example (three terminals, then open http://127.0.0.1:4200):
      prefect server start
      PREFECT_API_URL=http://127.0.0.1:4200/api stagewise serve --recipe tiny
      mlflow ui --backend-store-uri sqlite:///runs/tiny/mlflow.db
      stagewise serve --pool stagewise && prefect worker start --pool stagewise   # through a work pool
      stagewise serve --recipe-root ~/team-recipes --allow-set workdir --allow-set 'stages.sft.**'
    """
    from stagewise.cli.run import shipped_recipe
    from stagewise.deployments.catalog import build_deployments, check_cron
    from stagewise.flows.pipeline import tracker_for
    from stagewise.recipe import load_recipe
    from stagewise.recipe.form_policy import serving_policy
    from stagewise.recipe.shipped import resolve_recipe

    path = resolve_recipe(recipe) if recipe is not None else shipped_recipe("tiny")
    loaded = load_recipe(path)  # a broken default recipe exits 2 here, not in every flow run
    if schedule:
        check_cron(cron)
    tracking = tracker_for(loaded.recipe, Path(loaded.recipe.workdir).resolve()).uri
    policy = serving_policy(path, recipe_root, allow_set, [tracking])
    url = api_url()
    from prefect import serve

    made = build_deployments(path, schedule=schedule, cron=cron)
    if pool:
        kind = ensure_pool(pool)
        for deployment in made:  # a pool's workers read the policy from the job's environment
            deployment.job_variables = {**(deployment.job_variables or {}), "env": policy.to_env()}
            deployment.apply(work_pool_name=pool)
        typer.echo(f"Registered {len(made)} deployments of {path} on the {kind} work pool {pool!r} at {url}; "
                   f"start a worker to run them: prefect worker start --pool {pool}")
        return
    typer.echo(f"Serving {len(made)} deployments of {path} against {url}; forms may name recipes under "
               f"{', '.join(policy.recipe_roots)}", err=True)
    os.environ.update(policy.to_env())  # the runner starts every flow run with this environment
    serve(*made)


def ensure_pool(name: str) -> str:
    """The type of work pool `name`, made as a process pool (Prefect's default job template) when missing."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            return client.read_work_pool(name).type
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            return client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template)).type
