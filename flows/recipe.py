"""The recipe: one YAML file naming a model, its data and its stages. Import it from here.

    loaded = load_recipe("recipes/tiny.yaml", ["stages.pretrain.tokens=491520"])
    loaded.recipe.stages.pretrain.seq_length; recipe_hash(loaded.recipe)

This module is the recipe's public face; the work lives in small modules, one purpose each:

    flows/recipe_schema.py  the typed schema: pydantic models composing the libraries' configs,
                            STAGE_ORDER and `--stages` selection
    flows/recipe_checks.py  cross-field checks, each naming the exact field that breaks it
    flows/recipe_yaml.py    reading YAML with the line of every value; `base:` inheritance
                            (mappings merge, lists are replaced whole)
    flows/recipe_loader.py  load_recipe: `--set a.b[1].c=v` overrides checked against the
                            schema, validation in full before any work starts, `${name}` and
                            `${seed}` in the workdir
    flows/recipe_errors.py  RecipeError and how a problem is cited, `<yaml.path>: <why>
                            (<file>:<line>)`: a user fixes a recipe in an editor, not in a traceback
    flows/recipe_params.py  the resolved recipe's canonical dict, hash and MLflow params
"""

from __future__ import annotations

from flows.recipe_checks import SFT_WORLD_FILES
from flows.recipe_errors import RecipeError
from flows.recipe_loader import LoadedRecipe, load_recipe
from flows.recipe_params import MLFLOW_PARAM_MAX, flatten_recipe, recipe_dict, recipe_hash
from flows.recipe_schema import (
    STAGE_ORDER,
    PretrainStage,
    Recipe,
    SFTStage,
    SFTSubStage,
    StagesConfig,
    TrackingConfig,
    available_stages,
    select_stages,
)
from flows.stage_schemas import LongContextStage, MergeStage

__all__ = [
    "MLFLOW_PARAM_MAX",
    "SFT_WORLD_FILES",
    "STAGE_ORDER",
    "LoadedRecipe",
    "LongContextStage",
    "MergeStage",
    "PretrainStage",
    "Recipe",
    "RecipeError",
    "SFTStage",
    "SFTSubStage",
    "StagesConfig",
    "TrackingConfig",
    "available_stages",
    "flatten_recipe",
    "load_recipe",
    "recipe_dict",
    "recipe_hash",
    "select_stages",
]
