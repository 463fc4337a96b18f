"""The resolved recipe as data: its canonical dict, its hash, and its MLflow params.

recipe_hash() identifies a recipe by its values (formatting, comments and `base:` splits do
not change it); runs and checkpoints are tagged with it. flatten_recipe() turns the recipe
into the dotted-key params the pipeline logs to MLflow.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from stagewise.recipe.schema import Recipe


def recipe_dict(recipe: Recipe) -> dict:
    """The resolved recipe as plain JSON-able data, YAML keys (aliases) included."""
    return recipe.model_dump(mode="json", by_alias=True)


def recipe_hash(recipe: Recipe) -> str:
    """16 hex chars of sha256 over the canonical JSON of the resolved recipe.

    Formatting, comments, key order and `base:` splits do not change it; any value does.
    """
    canon = json.dumps(recipe_dict(recipe), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


MLFLOW_PARAM_MAX = 6000
"""MLflow refuses param values longer than this."""


def flatten_recipe(recipe: Recipe) -> dict[str, str]:
    """Dotted keys -> string values for MLflow params (`stages.pretrain.phases.0.until`).

    Lists of mappings are indexed with `.i` (MLflow keys allow no brackets); lists of
    scalars stay one JSON value. Values are cut to MLflow's 6000-character limit.
    """
    out: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{key}.{i}")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            out[re.sub(r"[^\w./\- :]", "_", key)[:250]] = text[:MLFLOW_PARAM_MAX]

    walk(recipe_dict(recipe), "")
    return out
