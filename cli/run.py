"""`stagewise run` and `stagewise demo`: train a recipe's stages as one Prefect flow.

These are the commands that start training; both go through `_run`, which checks the chosen
stages and runs the recipe doctor (recipe/doctor/__init__.py, `stagewise check`) before Prefect is
imported: a typo exits 2 at once, and so does a recipe the doctor finds errors in (unless
`run --force`); its warnings are printed and the run goes on. `demo` is `run` on the shipped
recipe `tiny` plus a pointer to the MLflow UI. `run` takes a recipe file or a shipped recipe's
name (recipe/shipped.py), so both work from an installed wheel, where there is no checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.options import DebugOpt, JsonOpt, RecipeArg, SetOpt, VerboseOpt, load
from stagewise.cli.output import BadInput, debugging, emit, guarded
from stagewise.recipe import shipped


def shipped_recipe(name: str) -> Path:
    """The shipped recipe `name` as a file, for a command's default recipe (demo; serve and quantize
    without --recipe): exit 2 when the install lacks it. `name` is its stem ("tiny"); the file name
    ("tiny.yaml") is accepted too, as older callers ask for it. Never a file of the current
    directory: a default must not depend on where the command runs.
    """
    found = shipped.shipped_recipe(name.removesuffix(shipped.RECIPE_SUFFIX))
    if found is None:
        raise BadInput(f"this install ships no recipe named {name!r} (shipped: {', '.join(shipped.shipped_names()) or 'none'})")
    return found


def _closing(result: dict) -> None:
    """The human ending of a run: the closing table, then where the results are."""
    from stagewise.flows.closing_table import render

    typer.echo("\n" + render(result["stages"]))
    log = f"; the whole log: {result['log_file']}" if result.get("log_file") else ""
    typer.echo(f"\nResults are under {result['workdir']}; MLflow {result['tracking_uri']} "
               f"(experiment '{result['experiment']}'); runtime {result['runtime']['device']}/"
               f"{result['runtime']['precision']}{log}.")
    served = result["tracking_uri"].startswith(("http://", "https://"))
    typer.echo(f"The pipeline's MLflow run: {result['mlflow_run_url']}"
               + ("" if served else f"  (after `mlflow ui --backend-store-uri {result['tracking_uri']}`)"))


def doctor(loaded, stages: Optional[list[str]], force: bool, label: str = "") -> None:
    """The recipe doctor on the stages that will run: warnings to stderr, errors exit 2 unless `force`
    (`label` prefixes every line: `stagewise ablate` names the variant)."""
    from stagewise.recipe.doctor import diagnose, failing
    from stagewise.recipe.errors import show_file

    findings = diagnose(loaded, stages)
    errors = failing(findings)
    if errors and not force:
        for f in findings:
            if f not in errors:
                typer.echo(label + f.line(), err=True)
        raise BadInput(f"{label}the recipe doctor found {len(errors)} error(s); fix them, or run anyway with --force "
                       f"(`stagewise check {show_file(str(loaded.path))}` lists every rule):\n"
                       + "\n".join(label + f.line() for f in errors))
    for f in findings:
        typer.echo(label + f.line(), err=True)


def _run(loaded, stages: Optional[str], resume: bool, force: bool = False, verbose: bool = False,
         debug: bool = False) -> dict:
    from stagewise.recipe import select_stages

    chosen = select_stages(loaded.recipe, stages)  # bad names exit 2 before Prefect starts
    doctor(loaded, chosen, force)
    from stagewise.cli.run_log import quiet_libraries, start_run_log

    quiet_libraries(verbose)  # before torch, transformers and Prefect are imported
    from stagewise.flows.pipeline import run_pipeline

    log: list[Path] = []  # the log file opens once every check passed: a refused run leaves no workdir
    summary = run_pipeline(loaded, stages=chosen, resume=resume,
                           on_start=lambda: log.append(start_run_log(loaded.recipe.workdir, verbose, debugging(debug))))
    return {**summary, "log_file": str(log[0].resolve()) if log else None}


@guarded
def run(
    recipe: Path = RecipeArg,
    stages: Optional[str] = typer.Option(None, "--stages", help="Comma-separated stages to run (default: every stage in the recipe)."),
    overrides: list[str] = SetOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue each stage from its latest checkpoint."),
    force: bool = typer.Option(False, "--force", help="Run even when the recipe doctor (`stagewise check`) finds errors."),
    verbose: bool = VerboseOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Run a recipe's stages as one Prefect flow, tracked in MLflow.

    The recipe doctor (`stagewise check`) judges the chosen stages first: its warnings are
    printed, its errors stop the run with exit 2 before anything starts, unless --force.

    Ends with one row per stage: its target metric before -> after, tokens, wall time and
    MLflow run id (`--json`: the same rows under "stages", each with its full result). A rerun
    of an unchanged recipe trains nothing: finished steps are reused (Cached in Prefect).

    RECIPE is a YAML file or the name of a shipped recipe (`tiny`, `nemotron-3-nano-4b`;
    `stagewise recipe show tiny` prints one): a file of that name wins.

    \b
    Example:
      stagewise run tiny --stages pretrain --set stages.pretrain.tokens=491520
      stagewise run recipes/tiny.yaml --set runtime.device=cpu --json
    """
    loaded = load(recipe, overrides)
    result = _run(loaded, stages, resume, force, verbose, debug)
    emit(result, as_json, lambda: _closing(result))


@guarded
def demo(
    overrides: list[str] = SetOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint."),
    verbose: bool = VerboseOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Train the tiny CPU demo end to end: world data, tokenizer, phased pretraining, MLflow.

    Runs the shipped recipe tiny (minutes on a laptop; the same as `stagewise run tiny`) and says
    where the results are (by default runs/tiny under the current directory).

    \b
    Example:
      stagewise demo --set stages.pretrain.tokens=491520
    """
    loaded = load(shipped_recipe("tiny"), overrides)
    result = _run(loaded, None, resume, verbose=verbose, debug=debug)
    workdir = result.get("workdir", str(Path(loaded.recipe.workdir).resolve()))
    uri = result.get("tracking_uri") or f"sqlite:///{Path(workdir) / 'mlflow.db'}"
    result = {**result, "mlflow_ui": f"mlflow ui --backend-store-uri {uri}"}
    emit(result, as_json, lambda: _closing(result))
