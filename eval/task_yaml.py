"""lm-eval task YAML read as data: the `include` chain merged, `!function` kept as a marked name.

What the checks need from a task's config (its splits, templates, metrics) without importing
lm-eval or running a task's own Python: lm-eval's loader resolves `!function utils.x` by
importing the module next to the YAML, which for some tasks needs packages or downloads
(ifeval fetches NLTK data on import). Here a function stays a `FunctionRef`, a string that
says it is one. eval/harness.py reads our local tasks with it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class FunctionRef(str):
    """`!function module.name` of a task YAML: code the task runs (its columns cannot be read off a template)."""


class _TaskYaml(yaml.SafeLoader):
    """lm-eval task YAML: `!function module.name` read as a FunctionRef (nothing is imported)."""


_TaskYaml.add_constructor("!function", lambda loader, node: FunctionRef(loader.construct_scalar(node)))


def task_config(path: Path) -> dict[str, Any]:
    """One task YAML with its `include` chain merged (the including file's keys win), as lm-eval reads it."""
    config = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_TaskYaml) or {}
    if not isinstance(config, dict):
        return {}
    includes = config.pop("include", None)
    merged: dict[str, Any] = {}
    for inc in includes if isinstance(includes, list) else ([includes] if includes else []):
        base = task_config(Path(inc) if Path(inc).is_absolute() else Path(path).parent / inc)
        base.pop("task_list", None)
        merged |= base
    return merged | config
