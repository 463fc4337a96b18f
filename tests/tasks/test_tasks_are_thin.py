"""tasks/ holds Prefect tasks only: every public name a tasks module defines is a Prefect task.

A stage's work is library code (data/, model/, eval/, quant/) that any process can run, a launched
job with no Prefect around it included; a task wraps one piece of it and logs to MLflow. So a tasks
module defines tasks, its private logging helpers, and constants, and nothing a library or a flow
could need besides the tasks themselves.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from prefect import Task

import stagewise.tasks


def _public_definitions(module) -> dict[str, object]:
    """Functions and classes defined in `module` itself (not imported), not starting with `_`."""
    return {name: obj for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj) or isinstance(obj, Task))
            and getattr(obj, "__module__", None) == module.__name__}


def _not_tasks(module) -> list[str]:
    return [f"{module.__name__}.{name}" for name, obj in _public_definitions(module).items() if not isinstance(obj, Task)]


def test_every_public_definition_in_tasks_is_a_prefect_task():
    found, bad = 0, []
    for info in pkgutil.iter_modules(stagewise.tasks.__path__):
        module = importlib.import_module(f"stagewise.tasks.{info.name}")
        found += len(_public_definitions(module))
        bad += _not_tasks(module)
    assert found >= 15, "the check saw the tasks modules"
    assert not bad, "move these to a library (data/, model/, eval/, quant/) or stagewise/refs.py:\n" + "\n".join(bad)


def test_the_check_finds_a_library_function_left_in_a_tasks_module():
    import types

    from prefect import task

    module = types.ModuleType("stagewise.tasks.probe")

    def score(rows):  # library work
        return rows

    @task
    def score_task(rows):
        return rows

    for obj in (score, score_task):
        obj.__module__ = module.__name__
    module.score, module.score_task = score, score_task
    assert set(_public_definitions(module)) == {"score", "score_task"}
    assert _not_tasks(module) == ["stagewise.tasks.probe.score"]
