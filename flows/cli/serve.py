"""`stagewise serve`: register the deployments with a Prefect server and run what it schedules.

This is how a person gets the pipeline into the Prefect UI: start a server, run this, open the
page, press Run on `stagewise-recipe/pipeline` and fill in its form. The deployments are defined
in deployments/catalog.py; this command only checks its recipe and `--cron`, and that the server
named by PREFECT_API_URL answers (bad input, exit 2, when it is unset or silent, since nothing
can be registered), and then serves until interrupted (Ctrl-C or SIGTERM pause the deployments on the way out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flows.cli.output import BadInput, guarded


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
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="The deployments' default recipe (default: the shipped recipes/tiny.yaml)."),
    schedule: bool = typer.Option(True, "--schedule/--no-schedule", help="Also serve the weekly scheduled pipeline run."),
    cron: str = typer.Option("0 3 * * 0", "--cron", help="The weekly deployment's cron schedule (UTC)."),
) -> None:
    """Register the pipeline's deployments with the Prefect server and run their flow runs.

    Serves stagewise-recipe/pipeline (the form: recipe, stages, --set overrides, resume),
    stagewise-recipe/weekly (the same on a cron schedule; --no-schedule leaves it out) and one
    deployment per stage. Flow runs start as local processes in this directory. The server is
    the one PREFECT_API_URL names; stop with Ctrl-C (the deployments are paused).

    \b
    Example (three terminals, then open http://127.0.0.1:4200):
      prefect server start
      PREFECT_API_URL=http://127.0.0.1:4200/api stagewise serve --recipe recipes/tiny.yaml
      mlflow ui --backend-store-uri sqlite:///runs/tiny/mlflow.db
    """
    from flows.cli.run import shipped_recipe
    from flows.recipe import load_recipe

    from deployments.catalog import build_deployments, check_cron

    path = recipe or shipped_recipe("tiny.yaml")
    load_recipe(path)  # a broken default recipe exits 2 here, not in every flow run
    if schedule:
        check_cron(cron)
    url = api_url()
    from prefect import serve


    made = build_deployments(path, schedule=schedule, cron=cron)
    typer.echo(f"Serving {len(made)} deployments of {path} against {url}", err=True)
    serve(*made)
