"""The one base of every typed config in stagewise: recipe blocks and the libraries' configs alike.

Strict, because a recipe is hostile input: an unknown key is refused (with the closest known one
named by the loader), never silently ignored. Field docstrings become the schema's descriptions
(`stagewise recipe schema`, the Prefect form), and a field with a YAML alias (`model.from`) is
also settable by its Python name, as `--set` and the loader's overrides do.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictConfig(BaseModel):
    """A pydantic model that refuses unknown keys and documents its fields from their docstrings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)
