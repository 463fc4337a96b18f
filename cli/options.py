"""The arguments and options several commands share, and how a recipe argument is loaded.

`stagewise run`, `data prepare`, `inspect`, `recipe show` and others all take a recipe file,
`--set` overrides, `--json` and `--debug`; declaring them once here keeps their names and help
texts identical across commands. `load` is the one place a command turns a recipe argument and
its overrides into a loaded recipe (stagewise.recipe is imported lazily so `--help` stays fast).

A recipe argument is a file path or the name of a recipe shipped in the package (`stagewise run
tiny`: an installed wheel has no recipes/ folder to point at). Both RecipeArg (as its callback,
so a command that hands the path on, like `ablate`, gets the file too) and `load` (for the
`--recipe` options) go through the one resolver, recipe/shipped.py `resolve_recipe`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from stagewise.recipe.errors import RecipeError
from stagewise.recipe.shipped import resolve_recipe, shipped_names

RECIPE_HELP = f"Recipe YAML file, or the name of a shipped recipe ({', '.join(shipped_names())})."
"""What a recipe argument or option accepts, for the help texts of every command taking one."""


def _recipe_file(recipe: Path) -> Path:
    """RecipeArg's callback: the file a shipped name means; anything else unchanged.

    An unknown name is left for `load` (or the recipe loader) to report: raised here, during
    option parsing, it would bypass the command's `--json` error reporting.
    """
    try:
        return resolve_recipe(recipe)
    except RecipeError:
        return recipe


RecipeArg = typer.Argument(..., help=RECIPE_HELP, show_default=False, callback=_recipe_file)
SetOpt = typer.Option(
    [], "--set", "-s", metavar="KEY=VALUE",
    help="Override a field, e.g. --set stages.pretrain.tokens=500000 or --set stages.pretrain.phases[1].until=0.9 "
         "(value parsed as YAML; repeatable).",
)
JsonOpt = typer.Option(False, "--json", help="Print the result as JSON on stdout.")
DebugOpt = typer.Option(False, "--debug", help="Show the full traceback of a failure (or STAGEWISE_DEBUG=1).")
VerboseOpt = typer.Option(False, "--verbose", help="Show every log line and library warning and progress bar on the terminal (by default only ours and errors; all of it is in <workdir>/logs/ either way).")
ExperimentOpt = typer.Option(..., "--experiment", help="MLflow experiment (by default the recipe name).")
RuleOpt = typer.Option(..., "--rule", help="YAML with a gate's all/any/guards/min_tokens (a whole gate block works too).")
TrackingUriOpt = typer.Option(None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI).")


def load(recipe: Path | str, overrides: list[str]):
    """The recipe (a file, or a shipped recipe's name) with its --set overrides applied (recipe.load_recipe).

    Exit 2 naming the shipped recipes when `recipe` is neither.
    """
    from stagewise.recipe import load_recipe

    return load_recipe(resolve_recipe(recipe), overrides)
