"""Benchmarks through lm-eval on a model already in memory, and suites named in a recipe.

    result = run_tasks(model, tokenizer, ["world", "gsm8k@evaldata/gsm8k"], limit=20)
    result.metrics["world_arithmetic/exact_match"], result.metrics["gsm8k/exact_match/strict-match"]

A training flow evaluates the weights it holds (no reload from disk) through lm-eval's
HFLM; `run_checkpoint` does the same for a checkpoint directory. A suite entry
(eval/task_spec.py) is one of our local `world_*` tasks (eval/benchmarks/), or a standard lm-eval
task on local files (`gsm8k@FOLDER`, eval/standard_tasks.py), optionally through the model's
chat template (`chat:gsm8k@FOLDER`). Nothing is downloaded: a standard task without its files
is refused. lm-eval's TaskManager indexes only our local tasks (instant); a standard task is
built from its own YAML, found by name (eval/lm_eval_tasks.py), so lm-eval's ~14,000 task
files are never indexed (12-30 s). Every entry is checked, and every standard task built on
its files, before the model is wrapped.
"""

from __future__ import annotations

import builtins
import contextlib
import difflib
import logging
import math
import os
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from transformers import AutoTokenizer

from stagewise.data.errors import BadInput
from stagewise.eval.benchmarks import TASKS_DIR
from stagewise.eval.local_data import first_row
from stagewise.eval.standard_tasks import StandardTask, UnknownTaskError, check_standard
from stagewise.eval.task_spec import CHAT_PREFIX, TaskSpec, parse_task
from stagewise.eval.task_yaml import task_config
from stagewise.model.build import load_model


@dataclass(frozen=True)
class EvalResult:
    """Headline numbers keyed `<task>/<metric>` plus lm-eval's whole results document."""

    metrics: dict[str, float]
    """e.g. {"world_arithmetic/exact_match": 0.12, "world_compare_mc/acc": 0.55}."""
    raw: dict[str, Any] = field(repr=False)
    """lm-eval's output (results, configs, versions, n-shot, ...) as plain JSON data."""


class UnknownSuiteError(ValueError):
    """A suite name the recipe's `eval` block does not define."""


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
def _task_manager():
    """lm-eval's TaskManager over our local tasks only (lm-eval's own are built from their YAML, never indexed)."""
    from lm_eval.tasks import TaskManager  # noqa: PLC0415 (lm_eval's task registry and models load only when a suite runs)

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False)


@dataclass(frozen=True)
class SuiteTasks:
    """A task list checked: the local names as lm-eval knows them, the standard tasks with their files."""

    local: list[str]
    standard: list[StandardTask]


def check_tasks(tasks: list[str]) -> SuiteTasks:
    """Every entry of `tasks` checked, reading no more than a row per data file (the harness's first
    step): BadInput listing every problem, UnknownTaskError when all of them are unknown names."""
    suite, problems, unknown = _check(tasks)
    if problems:
        raise (UnknownTaskError if unknown == len(problems) else BadInput)([why for _, why in problems])
    return suite


def suite_problems(tasks: list[str]) -> list[tuple[int, str]]:
    """(index, why) for each problem of a suite's entries: what the recipe loader reports, per entry."""
    return _check(tasks)[1]


def _check(tasks: list[str]) -> tuple[SuiteTasks, list[tuple[int, str]], int]:
    """(the entries sorted out, (index, why) of every problem, how many problems are unknown names)."""
    local_names = sorted(local_tasks()) + sorted(local_tags())
    local: list[str] = []
    standard: list[StandardTask] = []
    problems: list[tuple[int, str]] = []
    unknown = 0
    seen: dict[str, str] = {}
    for i, text in enumerate(tasks):
        try:
            spec = parse_task(text)
        except ValueError as e:
            problems.append((i, str(e)))
            continue
        if spec.name in seen:
            problems.append((i, f"{text}: {spec.name} is already in the list (as {seen[spec.name]}); its metrics "
                                f"would collide, so give each variant its own suite"))
            continue
        seen[spec.name] = text
        if spec.name in local_names:
            problems += [(i, why) for why in _local_entry_problems(spec)]
            local.append(spec.name)
            continue
        try:
            standard.append(check_standard(spec, local_names))
        except UnknownTaskError as e:
            problems, unknown = problems + [(i, why) for why in e.problems], unknown + len(e.problems)
        except BadInput as e:
            problems += [(i, why) for why in e.problems]
    return SuiteTasks(local, standard), problems, unknown


def _local_entry_problems(spec: TaskSpec) -> list[str]:
    out = []
    if spec.data:
        out.append(f"{spec.text}: {spec.name} is a local task with its own items (eval/benchmarks/data/); drop @{spec.data}")
    if spec.chat:
        out.append(f"{spec.text}: {CHAT_PREFIX} renders a standard task's prompts with the chat template; the local "
                   f"tasks' items are already written as the model reads them (world_chat_format's as chat turns)")
    return out


def _build_standard(tm, tasks: list[StandardTask]) -> list[tuple[StandardTask, Any]]:
    """Each standard task built by lm-eval on its files (its first row rendered): BadInput naming what failed."""
    built, problems = [], []
    for t in tasks:
        try:
            built.append((t, tm.load([t.lm_eval_config()])["tasks"][t.name]))
        except (KeyError, jinja2.exceptions.UndefinedError) as e:
            problems.append(f"{t.spec.text}: the task reads {e} from a row and its files lack it "
                            f"(columns of its first rows: {', '.join(_first_columns(t))})")
        except (ValueError, ImportError) as e:
            problems.append(f"{t.spec.text}: lm-eval cannot build the task on its files: {type(e).__name__}: {e}")
    if problems:
        raise BadInput(problems)
    return built


def _first_columns(task: StandardTask) -> list[str]:
    return sorted({c for ps in task.files.values() for p in ps for c in (first_row(p) or {})})


def task_manager(tasks: list[str]):
    """The TaskManager `run_tasks` uses, once every entry is checked and every standard task built on
    its files: bad input (an unknown name, a missing file or column) fails here, before a model loads."""
    return _prepare(list(tasks))[1]


def _prepare(tasks: list[str]) -> tuple[SuiteTasks, Any, list[tuple[StandardTask, Any]]]:
    """(the entries checked, the TaskManager, each standard task built by lm-eval on its files)."""
    suite = check_tasks(tasks)
    _quiet_lm_eval()
    tm = _task_manager()
    with terminal_prints():  # library chatter goes to the terminal, not into an orchestrator's log
        return suite, tm, _build_standard(tm, suite.standard)


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
    the terminal. So during an evaluation every library print goes where it was aimed, and with
    TQDM_DISABLE set (a quiet `stagewise run`: cli/run_log.py) lm-eval's bars, which pass tqdm's
    `disable` themselves and so ignore it, are dropped (`library_bars_off`).
    """
    swapped = builtins.print
    builtins.print = _terminal_print
    try:
        with library_bars_off():
            yield
    finally:
        builtins.print = swapped


class _StderrLines:
    """A stderr for libraries: progress-bar redraws are dropped, other lines go to the `lm_eval.stderr`
    logger (so a run's log file keeps them)."""

    def __init__(self) -> None:
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self._keep(line)
        return len(text)

    def flush(self) -> None:
        """Nothing to push: a line is logged when it ends (tqdm flushes after every half-drawn bar)."""

    def close(self) -> None:
        """Log what is left of an unfinished line (a library's last write without a newline)."""
        self._keep(self.pending)
        self.pending = ""

    @staticmethod
    def _keep(line: str) -> None:
        line = line.rsplit("\r", 1)[-1].strip()
        if line and not ("it/s]" in line or "s/it]" in line or "%|" in line):
            logging.getLogger("lm_eval.stderr").warning(line)


@contextlib.contextmanager
def library_bars_off():
    """Inside, with TQDM_DISABLE set: `sys.stderr` drops progress bars (tqdm's default stream), which
    libraries that pass tqdm's `disable` (lm-eval's request loops, modelopt's scoring) draw anyway.
    Without TQDM_DISABLE (a `--verbose` run, a notebook), nothing changes."""
    if os.environ.get("TQDM_DISABLE", "").lower() not in ("1", "true", "yes"):
        yield
        return
    lines = _StderrLines()
    try:
        with contextlib.redirect_stderr(lines):
            yield
    finally:
        lines.close()


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


@cache
def local_tasks() -> dict[str, dict[str, Any]]:
    """Every local task of eval/benchmarks/ (a YAML with a `task:` name) by name, its config resolved."""
    configs = [task_config(p) for p in sorted(TASKS_DIR.glob("*.yaml"))]
    return {c["task"]: c for c in configs if isinstance(c.get("task"), str)}


def local_tags() -> set[str]:
    """The tags our local tasks carry (`world`)."""
    return {t for c in local_tasks().values() for t in _as_list(c.get("tag"))}


def local_metric_names(names: list[str]) -> tuple[set[str], list[str]]:
    """(the `task/metric` names headline_metrics reports for the local tasks or tags among `names`,
    the names that are not local: lm-eval's standard tasks, whose metrics only lm-eval knows).
    `names` are suite entries: `chat:gsm8k@FOLDER` counts as gsm8k.

    A task's names are its metric_list under each entry of its filter_list (lm-eval's `none`
    when it has none); a tag stands for every local task carrying it."""
    tasks, outside = local_tasks(), []
    chosen: list[dict[str, Any]] = []
    for name in map(_task_name, names):
        tagged = [c for c in tasks.values() if name in _as_list(c.get("tag"))]
        chosen += [tasks[name]] if name in tasks else tagged
        outside += [] if name in tasks or tagged else [name]
    out = set()
    for c in chosen:
        filters = [f.get("name", "none") for f in c.get("filter_list") or []] or ["none"]
        for m in c.get("metric_list") or []:
            out |= {metric_name(c["task"], m["metric"], f, len(filters)) for f in filters}
    return out, outside


def _task_name(entry: str) -> str:
    try:
        return parse_task(entry).name
    except ValueError:
        return entry


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else ([] if value is None else [value])


def run_tasks(model, tokenizer, tasks: list[str], *, limit: int | float | None = None, batch_size: int = 8,
              max_length: int | None = None, device: str = "cpu", seed: int = 1234) -> EvalResult:
    """Evaluate an in-memory causal LM on suite entries (e.g. ["world", "chat:gsm8k@evaldata/gsm8k"]).

    `limit` caps the items per task (a fraction below 1 is a share). The model is put in
    eval mode for the run and handed back in the mode it came in. `max_length` (context
    + generation) defaults to the model's max_position_embeddings. The `chat:` tasks run in a
    second lm-eval pass with `apply_chat_template` and `fewshot_as_multiturn`: HFLM renders each
    prompt, few-shot examples as earlier turns, with the tokenizer's own chat template (a
    tokenizer without one is refused). `raw["chat_tasks"]` names them.
    """
    def hf_lm():
        from lm_eval.models.huggingface import HFLM  # noqa: PLC0415 (lm_eval's models load only when a suite runs)

        return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length, device=device)

    was_training = model.training  # before HFLM, which switches the model to eval mode itself
    try:
        return _run(hf_lm, tokenizer, tasks, limit, seed, before=model.eval)
    finally:
        model.train(was_training)


def run_tasks_on_server(url: str, served_name: str, tokenizer_dir: str | Path, tasks: list[str], *,
                        limit: int | float | None = None, batch_size: int = 8, max_length: int = 2048,
                        seed: int = 1234) -> EvalResult:
    """`run_tasks` through a running OpenAI-compatible server (vLLM's: model/vllm_server.py) instead of
    weights in memory: lm-eval's `local-completions` model, requests sent as token ids (the checkpoint's
    own tokenizer at `tokenizer_dir` encodes them, and renders the `chat:` tasks with its template), log-
    likelihoods read from the server's echoed prompt log-probs, generation through /v1/completions."""
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    def server_lm():
        from lm_eval.models.openai_completions import LocalCompletionsAPI  # noqa: PLC0415 (lm_eval's models load only when a suite runs)

        return LocalCompletionsAPI(model=served_name, base_url=f"{url.rstrip('/')}/v1/completions",
                                   tokenizer=str(tokenizer_dir), tokenizer_backend="huggingface", tokenized_requests=True,
                                   batch_size=batch_size, max_length=max_length, seed=seed, num_concurrent=1)

    return _run(server_lm, tokenizer, tasks, limit, seed)


def _run(make_lm, tokenizer, tasks: list[str], limit: int | float | None, seed: int, before=None) -> EvalResult:
    """The suite entries checked and built, then lm-eval's plain pass and chat pass on `make_lm()`."""
    if not tasks:
        raise ValueError("no tasks given")
    suite, tm, built = _prepare(list(tasks))  # bad entries fail here, before the model is wrapped
    chat = [t.spec.text for t, _ in built if t.spec.chat]
    if chat and not getattr(tokenizer, "chat_template", None):
        raise BadInput(f"{', '.join(chat)}: a {CHAT_PREFIX} task renders its prompts with the tokenizer's chat "
                       f"template, and this tokenizer has none (evaluate a checkpoint whose tokenizer carries one, "
                       f"or drop {CHAT_PREFIX})")
    from lm_eval import simple_evaluate  # noqa: PLC0415 (lm_eval's task registry and models load only when a suite runs)

    passes = [(suite.local + [task for t, task in built if not t.spec.chat], False),
              ([task for t, task in built if t.spec.chat], True)]
    lm = make_lm()
    if before is not None:
        before()
    outs = []
    with terminal_prints():  # library chatter goes to the terminal, not into an orchestrator's log
        for group, as_chat in passes:
            if group:
                outs.append(simple_evaluate(model=lm, tasks=group, limit=limit, task_manager=tm, log_samples=False,
                                            apply_chat_template=as_chat, fewshot_as_multiturn=as_chat,
                                            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                            fewshot_random_seed=seed))
    raw = _merge([_plain(o or {}) for o in outs]) | {"chat_tasks": [t.name for t, _ in built if t.spec.chat]}
    return EvalResult(headline_metrics(raw.get("results", {})), raw)


_PER_TASK = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples")
"""The keys of lm-eval's output that hold one entry per task (merged across passes)."""


def _merge(outs: list[dict[str, Any]]) -> dict[str, Any]:
    """One lm-eval output from the plain and the chat pass: per-task entries together, the rest from the first."""
    merged = dict(outs[0]) if outs else {}
    for out in outs[1:]:
        for key in _PER_TASK:
            if isinstance(out.get(key), dict):
                merged[key] = {**(merged.get(key) or {}), **out[key]}
    return merged


def run_checkpoint(ckpt_dir: str | Path, tasks: list[str], **kwargs: Any) -> EvalResult:
    """Load a checkpoint directory (weights, MTP heads, tokenizer) and run `run_tasks` on it."""
    device = kwargs.get("device", "cpu")
    model = load_model(ckpt_dir, device=device)
    tokenizer = AutoTokenizer.from_pretrained(str(ckpt_dir))
    return run_tasks(model, tokenizer, tasks, **kwargs)

