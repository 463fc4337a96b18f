"""Benchmarks through lm-eval on a model already in memory, and suites named in a recipe.

    result = run_tasks(model, tokenizer, ["world"], limit=20)
    result.metrics["world_arithmetic/exact_match"]

A training flow evaluates the weights it holds (no reload from disk) through lm-eval's
HFLM; `run_checkpoint` does the same for a checkpoint directory. Our local `world_*` tasks
(eval/tasks/) and lm-eval's standard task names work side by side. lm-eval imports take
seconds and indexing its 14,000 standard tasks takes ~12 s more, so both happen only when
needed: a request that names only local tasks never indexes the standard ones.
"""

from __future__ import annotations

import builtins
import contextlib
import difflib
import logging
import math
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from stagewise.eval.tasks import TASKS_DIR


@dataclass(frozen=True)
class EvalResult:
    """Headline numbers keyed `<task>/<metric>` plus lm-eval's whole results document."""

    metrics: dict[str, float]
    """e.g. {"world_arithmetic/exact_match": 0.12, "world_compare_mc/acc": 0.55}."""
    raw: dict[str, Any] = field(repr=False)
    """lm-eval's output (results, configs, versions, n-shot, ...) as plain JSON data."""


class UnknownSuiteError(ValueError):
    """A suite name the recipe's `eval` block does not define."""


class UnknownTaskError(ValueError):
    """A task name neither lm-eval nor eval/tasks/ knows."""


def resolve_suite(recipe_eval: dict[str, list[str]], name: str) -> list[str]:
    """The task list of suite `name`, or an error that lists the suites the recipe defines."""
    if name in recipe_eval:
        return list(recipe_eval[name])
    if not recipe_eval:
        raise UnknownSuiteError(f"unknown eval suite {name!r}: the recipe defines no suites (add `eval: {{{name}: [task, ...]}}`)")
    near = difflib.get_close_matches(name, list(recipe_eval), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise UnknownSuiteError(f"unknown eval suite {name!r}{hint}; the recipe defines: {', '.join(sorted(recipe_eval))}")


@cache
def _task_manager(with_defaults: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=with_defaults)


def task_manager(tasks: list[str]):
    """Our local tasks alone when they cover `tasks` (instant), else with lm-eval's standard ones."""
    local = _task_manager(False)
    if all(t in local.all_tasks for t in tasks):
        return local
    full = _task_manager(True)
    unknown = [t for t in tasks if t not in full.all_tasks]
    if unknown:
        near = difflib.get_close_matches(unknown[0], full.all_tasks, n=3)
        hint = f" (nearest: {', '.join(near)})" if near else ""
        raise UnknownTaskError(f"unknown lm-eval task(s) {', '.join(unknown)}{hint}; local tasks: "
                               f"{', '.join(local.all_tasks)}")
    return full


class _Quiet(logging.Filter):
    """Drop lm-eval's per-task 'Custom kwargs can be passed to --metadata' notice (our loader takes none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed" not in record.getMessage()


def _quiet_lm_eval() -> None:
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    task_log = logging.getLogger("lm_eval.api.task")
    if not any(isinstance(f, _Quiet) for f in task_log.filters):
        task_log.addFilter(_Quiet())


def _terminal_print(*values: object, sep: str | None = " ", end: str | None = "\n", file: Any = None,
                    flush: bool = False) -> None:
    """What the builtin `print` does: write to `file`, else to whatever `sys.stdout` is now."""
    stream = sys.stdout if file is None else file
    if stream is None:
        return
    stream.write((" " if sep is None else sep).join(map(str, values)) + ("\n" if end is None else end))
    if flush:
        stream.flush()


@contextlib.contextmanager
def terminal_prints():
    """Inside: `print` writes to its stream again, even where an orchestrator turned prints into log records.

    Prefect's `log_prints=True` swaps `builtins.print` for a function that logs every print
    aimed at stdout or stderr, ignoring where `sys.stdout` points at that moment. Under lm-eval,
    datasets fingerprints each task's Arrow table through dill, which disassembles a function
    with `dis.dis` into a stdout it has redirected to a buffer; with the swap, that disassembly
    (`LOAD_GLOBAL (pa)` ...) became dozens of lines in the flow run's log and dill read an empty
    buffer. lm-eval's progress bars (tqdm) never pass through `print`: they write to stderr,
    the terminal. So during an evaluation every library print goes where it was aimed.
    """
    swapped = builtins.print
    builtins.print = _terminal_print
    try:
        yield
    finally:
        builtins.print = swapped


def _plain(obj: Any) -> Any:
    """JSON data: numpy scalars become numbers, NaN/inf None, anything else its string."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def headline_metrics(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """lm-eval's `results` ({task: {"metric,filter": v}}) as {"task/metric": v}.

    The filter is dropped when it is `none` or the metric's only one (our tasks have one,
    "strip"); otherwise it becomes a third part, `task/metric/filter` (gsm8k's strict-match
    and flexible-extract). MLflow names cannot hold commas, hence the slash. Standard
    errors stay in `raw`.
    """
    per_metric: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for task, res in results.items():
        for key, value in res.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            if not metric.endswith("_stderr"):
                per_metric.setdefault((task, metric), []).append((filt, float(value)))
    out = {}
    for (task, metric), values in per_metric.items():
        for filt, value in values:
            out[metric_name(task, metric, filt, len(values))] = value
    return dict(sorted(out.items()))


def metric_name(task: str, metric: str, filt: str, filters: int) -> str:
    """`task/metric`, or `task/metric/filter` when the metric is reported under several filters."""
    return f"{task}/{metric}" if filt == "none" or filters == 1 else f"{task}/{metric}/{filt}"


class _TaskYaml(yaml.SafeLoader):
    """lm-eval task YAML: `!function module.name` read as its text (nothing is imported)."""


_TaskYaml.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def _task_config(path: Path) -> dict[str, Any]:
    """One task YAML with its `include` chain merged (the including file's keys win), as lm-eval reads it."""
    config = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskYaml) or {}
    base = config.pop("include", None)
    return {**_task_config(path.parent / base), **config} if base else config


@cache
def local_tasks() -> dict[str, dict[str, Any]]:
    """Every local task of eval/tasks/ (a YAML with a `task:` name) by name, its config resolved."""
    configs = [_task_config(p) for p in sorted(TASKS_DIR.glob("*.yaml"))]
    return {c["task"]: c for c in configs if isinstance(c.get("task"), str)}


def local_metric_names(names: list[str]) -> tuple[set[str], list[str]]:
    """(the `task/metric` names headline_metrics reports for the local tasks or tags among `names`,
    the names that are not local: lm-eval's standard tasks, whose metrics only lm-eval knows).

    A task's names are its metric_list under each entry of its filter_list (lm-eval's `none`
    when it has none); a tag stands for every local task carrying it."""
    tasks, outside = local_tasks(), []
    chosen: list[dict[str, Any]] = []
    for name in names:
        tagged = [c for c in tasks.values() if name in _as_list(c.get("tag"))]
        chosen += [tasks[name]] if name in tasks else tagged
        outside += [] if name in tasks or tagged else [name]
    out = set()
    for c in chosen:
        filters = [f.get("name", "none") for f in c.get("filter_list") or []] or ["none"]
        for m in c.get("metric_list") or []:
            out |= {metric_name(c["task"], m["metric"], f, len(filters)) for f in filters}
    return out, outside


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else ([] if value is None else [value])


def run_tasks(model, tokenizer, tasks: list[str], *, limit: int | float | None = None, batch_size: int = 8,
              max_length: int | None = None, device: str = "cpu", seed: int = 1234) -> EvalResult:
    """Evaluate an in-memory causal LM on lm-eval tasks, tags or groups (e.g. ["world"]).

    `limit` caps the items per task (a fraction below 1 is a share). The model is put in
    eval mode for the run and handed back in the mode it came in. `max_length` (context
    + generation) defaults to the model's max_position_embeddings.
    """
    if not tasks:
        raise ValueError("no tasks given")
    tm = task_manager(list(tasks))  # unknown names fail here, before the model is wrapped
    _quiet_lm_eval()
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    was_training = model.training  # before HFLM, which switches the model to eval mode itself
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length, device=device)
    model.eval()
    try:
        with terminal_prints():  # library chatter goes to the terminal, not into an orchestrator's log
            out = simple_evaluate(model=lm, tasks=list(tasks), limit=limit, task_manager=tm, log_samples=False,
                                  random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                  fewshot_random_seed=seed)
    finally:
        model.train(was_training)
    raw = _plain(out or {})
    return EvalResult(headline_metrics(raw.get("results", {})), raw)


def run_checkpoint(ckpt_dir: str | Path, tasks: list[str], **kwargs: Any) -> EvalResult:
    """Load a checkpoint directory (weights, MTP heads, tokenizer) and run `run_tasks` on it."""
    from transformers import AutoTokenizer

    from stagewise.model.build import load_model

    device = kwargs.get("device", "cpu")
    model = load_model(ckpt_dir, device=device)
    tokenizer = AutoTokenizer.from_pretrained(str(ckpt_dir))
    return run_tasks(model, tokenizer, tasks, **kwargs)

