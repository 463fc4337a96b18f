"""The recipes shipped inside the package, found by name: `stagewise run tiny` works from a wheel.

A user who installed stagewise has no checkout, so there is no `recipes/tiny.yaml` to point at;
the recipes travel as package data (`stagewise/recipes/*.yaml`, pyproject.toml) and are read
through importlib.resources, never through the source tree, so a checkout (where
stagewise/recipes links ../recipes) and an installed wheel find the same files. A shipped
recipe's name is its file stem ("tiny", "nemotron-3-nano-4b").

`resolve_recipe` is how every command turns its RECIPE argument into a file: an existing path
wins (a local `tiny` file is never shadowed by the shipped one), then a shipped name, else the
usual bad-input error, naming the shipped recipes so the user sees what a name could be.

The shipped files are used in place, not copied: a recipe's relative paths (`base:`, a source's
`path:`) resolve against its own directory, which for a shipped recipe is inside the installed
package, so `base: tiny.yaml` finds its sibling. That needs the package on disk, as pip installs
it; the workdir (`runs/${name}`) resolves against the current directory, so runs never write
into the package.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from stagewise.recipe.errors import RecipeError, did_you_mean, show_file

RECIPE_SUFFIX = ".yaml"
"""The suffix a shipped recipe has (pyproject.toml ships `recipes/*.yaml`)."""


def _shipped_files() -> dict[str, Path]:
    """Name -> file of every shipped recipe, in name order."""
    folder = files("stagewise") / "recipes"
    if not isinstance(folder, Path) or not folder.is_dir():  # a zipped or recipe-less install
        return {}
    return {p.stem: p for p in sorted(folder.iterdir()) if p.suffix == RECIPE_SUFFIX and p.is_file()}


def shipped_names() -> list[str]:
    """The names `stagewise run NAME` accepts, sorted: the stems of the shipped recipe files."""
    return list(_shipped_files())


def shipped_recipe(name: str) -> Path | None:
    """The shipped recipe called `name` (a file stem, e.g. "tiny"), or None when none is.

    Only a listed name matches, so a name can never reach outside the recipes folder ("../x").
    """
    return _shipped_files().get(name)


def resolve_recipe(recipe: str | Path) -> Path:
    """The recipe file a RECIPE argument means: an existing file path, else a shipped recipe's name.

    Raises RecipeError (exit 2) when it is neither, listing the shipped names.
    """
    path = Path(recipe).expanduser()
    if path.is_file():
        return path
    found = shipped_recipe(str(recipe))
    if found is not None:
        return found
    names = shipped_names()
    hint = did_you_mean(str(recipe), names)
    raise RecipeError([f"recipe file not found: {show_file(str(path.resolve()))}; nor is it the name of a shipped "
                       f"recipe (shipped: {', '.join(names) or 'none in this install'}){hint}"])
