"""`stagewise recipe show|schema`: look at a recipe the way the pipeline will see it.

The recipe group has its own Typer app (`recipe_app`, mounted as `recipe` by stagewise.cli):
`show` prints the resolved recipe (base: merged, --set applied, defaults filled) with its hash,
`schema` prints the JSON schema for editors. Neither trains anything; they exist so a user
can check a recipe before running it.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from stagewise.cli.options import JsonOpt, RecipeArg, SetOpt, load
from stagewise.cli.output import emit, guarded

recipe_app = typer.Typer(help="Recipe commands: show a resolved recipe, print the JSON schema.", no_args_is_help=True)

@recipe_app.command("show")
@guarded
def recipe_show(
    recipe: Path = RecipeArg,
    overrides: list[str] = SetOpt,
    raw: bool = typer.Option(False, "--raw", help="Show the merged YAML as written (after base: and --set), without defaults."),
    as_json: bool = JsonOpt,
) -> None:
    """Print the resolved recipe (base: merged, --set applied, defaults filled) and its hash.

    RECIPE is a YAML file or the name of a shipped recipe: start from `tiny` (the CPU demo) or
    `nemotron-3-nano-4b`, copy it next to your data and edit it (`--raw` shows it as written).

    \b
    Example:
      stagewise recipe show tiny
      stagewise recipe show nemotron-3-nano-4b --set seed=7
      stagewise recipe show tiny --raw > my-recipe.yaml
    """
    import yaml

    from stagewise.recipe import recipe_dict, recipe_hash

    loaded = load(recipe, overrides)
    body, digest = (loaded.raw if raw else recipe_dict(loaded.recipe)), recipe_hash(loaded.recipe)
    if as_json:
        emit({"path": str(loaded.path), "hash": digest, "recipe": body}, True)
        return
    typer.echo(f"# {loaded.path}  (recipe hash {digest})")
    typer.echo(yaml.safe_dump(body, sort_keys=False, allow_unicode=True), nl=False)


@recipe_app.command("schema")
@guarded
def recipe_schema() -> None:
    """Print the recipe's JSON schema (every field with its description), e.g. for editor completion.

    \b
    Example:
      stagewise recipe schema > recipe.schema.json
    """
    from stagewise.recipe import Recipe

    schema = Recipe.model_json_schema(by_alias=True)
    schema["properties"]["base"] = {"type": "string", "description": "Inherit from this recipe file (relative path); mappings merge, lists are replaced."}
    typer.echo(json.dumps(schema, indent=2))
