"""lm-eval's own task YAMLs, found by name without building lm-eval's index.

lm-eval's TaskManager parses all ~14,000 YAMLs it ships before it can load one (12-30 s on
these machines); a suite that names gsm8k needs one file. A task's YAML is usually named after
it (gsm8k/gsm8k.yaml, arc/arc_easy.yaml), so a file-name glob (0.05 s) finds it, confirmed by
its `task:` key; otherwise (gsm8k_cot lives in gsm8k-cot.yaml) one text scan of every YAML's
`task:` and `group:` lines (0.5 s) does, and also gives the close names for a typo. Nothing
here imports lm_eval.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

from stagewise.eval.task_yaml import task_config

_DECLARED = re.compile(r"^(task|group):[ \t]*[\"']?([A-Za-z0-9_][A-Za-z0-9_.\-]*)[\"']?[ \t]*(?:#.*)?$", re.M)
"""A YAML's top-level `task: name` / `group: name` line."""


@cache
def tasks_root() -> Path:
    """lm-eval's tasks folder (found without importing lm_eval)."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("lm-eval is not installed (pip install lm-eval)")
    return Path(next(iter(spec.submodule_search_locations))) / "tasks"


def find_task_yaml(name: str) -> Path | None:
    """The YAML that defines standard task `name`, or None (unknown, or a group or tag)."""
    for path in sorted(tasks_root().rglob(f"{name}.yaml")):
        if task_config(path).get("task") == name:
            return path
    found = _declared().get(("task", name))
    return found[0] if found else None


def is_group(name: str) -> bool:
    """Is `name` one of lm-eval's groups (several tasks, each with its own dataset)?"""
    return ("group", name) in _declared()


def standard_names() -> list[str]:
    """Every task and group name lm-eval's YAMLs declare (for did-you-mean)."""
    return sorted({name for _, name in _declared()})


@cache
def _declared() -> dict[tuple[str, str], list[Path]]:
    """(`task` | `group`, name) -> the YAMLs declaring it, from one text scan of lm-eval's tasks folder."""
    out: dict[tuple[str, str], list[Path]] = {}
    for path in sorted(tasks_root().rglob("*.yaml")):
        for kind, name in _DECLARED.findall(path.read_text(encoding="utf-8", errors="replace")):
            out.setdefault((kind, name), []).append(path)
    return out
