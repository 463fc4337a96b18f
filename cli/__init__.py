"""The `stagewise` command: run recipes, prepare data, size models, show recipes.

    stagewise demo                          # the tiny CPU demo, end to end
    stagewise run recipes/tiny.yaml --set stages.pretrain.tokens=491520
    stagewise recipe show recipes/nemotron-3-nano-4b.yaml

Exit codes: 0 success, 2 bad input (a recipe error, a bad source line, a broken checkpoint or
rule file, a bad option: one clear message naming the field, file and line, no traceback; the
one type for it is data.errors.BadInput, which recipe.errors.RecipeError is), 1 a failure while running (the error; the traceback only with
`--debug` or STAGEWISE_DEBUG=1). torch, transformers, prefect and mlflow are imported
inside the commands that need them, so `stagewise --help` stays fast.

This package only builds the `app` and mounts the commands, one module per command group:
run.py (run, demo), check.py (check: the recipe doctor), data.py (data prepare|curate|pack), inspect.py, recipe.py (recipe
show|schema), evaluate.py (eval, cutoffs), promote.py, merge.py, quantize.py, serve.py (the Prefect deployments), serve_model.py (a checkpoint behind vLLM), ablate.py (ablation sweeps); output.py holds the shared result and
error reporting, options.py the shared arguments. The order below is the order `--help` lists.
"""

from __future__ import annotations

import sys
from typing import Sequence

import typer

from stagewise.cli import (
    ablate,
    check,
    data,
    evaluate,
    inspect,
    merge,
    promote,
    quantize,
    recipe,
    run,
    serve,
    serve_model,
)
from stagewise.cli.options import DebugOpt
from stagewise.cli.output import DEBUG
from stagewise.cli.run import shipped_recipe
from stagewise.recipe.errors import BadInput

__all__ = ["app", "main", "BadInput", "shipped_recipe"]

app = typer.Typer(
    name="stagewise",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(data.data_app, name="data")
app.add_typer(recipe.recipe_app, name="recipe")
app.command()(run.run)
app.command()(run.demo)
app.command("check")(check.check_cmd)
app.command("inspect")(inspect.inspect_cmd)
app.command("eval")(evaluate.eval_cmd)
app.command("cutoffs")(evaluate.cutoffs_cmd)
app.command("promote")(promote.promote_cmd)
app.command("merge")(merge.merge_cmd)
app.command("quantize")(quantize.quantize_cmd)
app.command("serve")(serve.serve_cmd)
app.command("serve-model")(serve_model.serve_model_cmd)
app.command("ablate")(ablate.ablate_cmd)


@app.callback()
def _main(debug: bool = DebugOpt) -> None:
    """Train NemotronH hybrid models stage by stage from one YAML recipe (Prefect + MLflow).

    Start with `stagewise demo`, then `stagewise recipe show tiny` (a shipped recipe by name, or any recipe file).
    """
    DEBUG["on"] = debug


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`stagewise = stagewise.cli:main`); `argv` for calling it in-process.

    The CLI edge for bad input: each command's wrapper (cli/output.py `guarded`) reports
    BadInput as exit 2, and whatever BadInput escapes outside a command (a callback, option
    parsing) is reported here the same way, message only, never a traceback.
    """
    try:
        app(args=list(argv) if argv is not None else None, prog_name="stagewise")
    except BadInput as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
