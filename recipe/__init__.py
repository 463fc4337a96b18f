"""The recipe: one YAML file naming a model, its data and its stages. Import it from here.

    loaded = load_recipe("recipes/tiny.yaml", ["stages.pretrain.tokens=491520"])
    loaded.recipe.stages.pretrain.seq_length; recipe_hash(loaded.recipe)

This module is the recipe's public face; the work lives in small modules, one purpose each:

    recipe/schema.py  the typed schema: pydantic models composing the libraries' configs,
                            STAGE_ORDER and `--stages` selection
    recipe/checks.py  cross-field checks, each naming the exact field that breaks it
    recipe/yaml_source.py    reading YAML with the line of every value; `base:` inheritance
                            (mappings merge, lists are replaced whole)
    recipe/loader.py  load_recipe: `--set a.b[1].c=v` overrides checked against the
                            schema, validation in full before any work starts, `${name}` and
                            `${seed}` in the workdir
    recipe/errors.py  RecipeError and how a problem is cited, `<yaml.path>: <why>
                            (<file>:<line>)`: a user fixes a recipe in an editor, not in a traceback
    recipe/params.py  the resolved recipe's canonical dict, hash and MLflow params
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOME = {
    "SFT_WORLD_FILES": "checks",
    "RecipeError": "errors",
    "LoadedRecipe": "loader", "load_recipe": "loader",
    "MLFLOW_PARAM_MAX": "params", "flatten_recipe": "params", "recipe_dict": "params", "recipe_hash": "params",
    "STAGE_ORDER": "schema", "Recipe": "schema", "StagesConfig": "schema", "TrackingConfig": "schema",
    "available_stages": "schema", "select_stages": "schema",
    "PretrainStage": "blocks.pretrain", "SFTStage": "blocks.sft", "SFTSubStage": "blocks.sft",
    "MergeStage": "blocks.merge", "LongContextStage": "blocks.long_context",
}
"""Public name -> the module that defines it. Names load on first use (PEP 562), so importing one
part of the recipe room (the doctor's rule list for `stagewise --help`, an error type) does not
load the whole schema and the libraries behind it."""

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # what editors and type checkers read
    from stagewise.recipe.blocks.long_context import LongContextStage
    from stagewise.recipe.blocks.merge import MergeStage
    from stagewise.recipe.blocks.pretrain import PretrainStage
    from stagewise.recipe.blocks.sft import SFTStage, SFTSubStage
    from stagewise.recipe.checks import SFT_WORLD_FILES
    from stagewise.recipe.errors import RecipeError
    from stagewise.recipe.loader import LoadedRecipe, load_recipe
    from stagewise.recipe.params import MLFLOW_PARAM_MAX, flatten_recipe, recipe_dict, recipe_hash
    from stagewise.recipe.schema import (
        STAGE_ORDER,
        Recipe,
        StagesConfig,
        TrackingConfig,
        available_stages,
        select_stages,
    )
