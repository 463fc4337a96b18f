"""The arguments and options several commands share, and how a recipe argument is loaded.

`stagewise run`, `data prepare`, `inspect`, `recipe show` and others all take a recipe file,
`--set` overrides, `--json` and `--debug`; declaring them once here keeps their names and help
texts identical across commands. `load` is the one place a command turns a recipe path and its
overrides into a loaded recipe (flows.recipe is imported lazily so `--help` stays fast).
"""

from __future__ import annotations

from pathlib import Path

import typer

RecipeArg = typer.Argument(..., help="Recipe YAML file.", show_default=False)
SetOpt = typer.Option(
    [], "--set", "-s", metavar="KEY=VALUE",
    help="Override a field, e.g. --set stages.pretrain.tokens=500000 or --set stages.pretrain.phases[1].until=0.9 "
         "(value parsed as YAML; repeatable).",
)
JsonOpt = typer.Option(False, "--json", help="Print the result as JSON on stdout.")
DebugOpt = typer.Option(False, "--debug", help="Show the full traceback of a failure (or STAGEWISE_DEBUG=1).")
ExperimentOpt = typer.Option(..., "--experiment", help="MLflow experiment (by default the recipe name).")
RuleOpt = typer.Option(..., "--rule", help="YAML with a gate's all/any/guards/min_tokens (a whole gate block works too).")
TrackingUriOpt = typer.Option(None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI).")


def load(recipe: Path, overrides: list[str]):
    """The recipe file with its --set overrides applied (flows.recipe.load_recipe)."""
    from stagewise.recipe import load_recipe

    return load_recipe(recipe, overrides)
