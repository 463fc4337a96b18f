"""A standard lm-eval task on local files: what it reads, the refusals, and the config lm-eval runs.

    task = check_standard(parse_task("gsm8k@evaldata/gsm8k"), local_names)  # BadInput: the files to provide
    task.lm_eval_config()                                                   # gsm8k's own config, dataset replaced

Nothing is downloaded at run time, so a standard task runs only on files the team has. The task
keeps everything of its own lm-eval YAML (prompts, few-shot count, metrics, filters, its
`process_docs`); only the dataset changes: `custom_dataset` becomes eval/local_data.py's
in-memory loader and `dataset_kwargs` names the folder's split files. Splits the task names but
does not need (arc_easy's train and validation at 0-shot) may be left out: the derived config
drops them, as lm-eval would otherwise index them when it looks for few-shot examples.

`check_standard` reads the task's YAML (eval/task_yaml.py, nothing imported) and one row per
file, so a recipe is checked in a fraction of a second, before any work (recipe/checks.py). It
checks the columns the task's templates read (`{{question}}`, a bare `doc_to_text: prompt`);
what a task's own Python reads (`process_docs`, `process_results`) only running it shows, so the
harness builds every task before it wraps the model and names a column its first row lacks.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta

from stagewise.data.errors import BadInput
from stagewise.eval.lm_eval_tasks import find_task_yaml, is_group, standard_names, tasks_root
from stagewise.eval.local_data import SUFFIXES, first_row, load, split_files
from stagewise.eval.task_spec import TaskSpec
from stagewise.eval.task_yaml import FunctionRef, task_config


@dataclass(frozen=True)
class CodeNeeds:
    """What a task's own Python needs on this machine, checked before it is imported."""

    packages: tuple[str, ...] = ()
    """Python distributions its modules import (`name` or `name>=version`)."""
    nltk_data: tuple[str, ...] = ()
    """NLTK resources it looks up; ifeval's module downloads a missing one on import."""
    columns: tuple[str, ...] = ()
    """Columns its process_results reads (no template shows them)."""


CODE_NEEDS: dict[str, CodeNeeds] = {
    folder: CodeNeeds(packages=("langdetect", "immutabledict", "nltk>=3.9.1"), nltk_data=("tokenizers/punkt_tab",),
                      columns=("key", "prompt", "instruction_id_list", "kwargs"))
    for folder in ("ifeval", "leaderboard/ifeval")
}
"""lm-eval task folders whose code needs more than lm-eval's own dependencies."""

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_TEMPLATE_FIELDS = ("doc_to_text", "doc_to_target", "doc_to_choice")
"""Fields where a bare name is a column (lm-eval: `doc[field] if field in features`)."""
_JINJA_FIELDS = (*_TEMPLATE_FIELDS, "description", "gen_prefix")


@dataclass(frozen=True)
class SplitNeed:
    """One split a task reads: its config key's value, the columns its templates use, and why."""

    split: str
    columns: tuple[str, ...]
    """The columns its templates read (checked against each file's first row)."""
    why: str
    code: bool = False
    """Its rows also go through the task's own Python (process_docs, a function template), which may read more."""


@dataclass(frozen=True)
class StandardTask:
    """A standard task checked against its local folder."""

    spec: TaskSpec
    yaml_path: Path
    config: dict[str, Any]
    """The task's YAML as data (includes merged, functions unresolved)."""
    files: dict[str, list[Path]]
    """split -> its files (absolute), only the splits the task names."""

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def _resolved(self) -> dict[str, Any]:
        """lm-eval's own reading of the YAML (functions imported), once the checks passed."""
        from lm_eval.tasks._yaml_loader import load_yaml  # noqa: PLC0415 (lm_eval's task registry and models load only when a suite runs)

        return load_yaml(self.yaml_path, resolve_func=True)

    def lm_eval_config(self) -> dict[str, Any]:
        """The config dict TaskManager.load builds the task from: the task's own, dataset replaced."""
        cfg = {k: v for k, v in self._resolved.items() if k not in ("tag", "group", "task_list")}
        cfg |= {"dataset_path": str(Path(self.spec.data or ".").resolve()), "dataset_name": None, "custom_dataset": load,
                "dataset_kwargs": {"data_files": {s: [str(p) for p in ps] for s, ps in self.files.items()}}}
        for key in ("training_split", "validation_split", "fewshot_split"):
            if cfg.get(key) is not None and cfg[key] not in self.files:
                cfg[key] = None
        shots = cfg.get("fewshot_config")
        if isinstance(shots, dict) and shots.get("split") is not None and shots["split"] not in self.files:
            cfg["fewshot_config"] = {k: v for k, v in shots.items() if k != "split"}
        return cfg


# --------------------------------------------------------------------------- what a task reads

def split_needs(config: dict[str, Any], name: str) -> tuple[list[SplitNeed], list[str]]:
    """(the splits a task must be given, every split it names): its scored split (test, else
    validation) and, when it runs few-shot from a split, the split its examples come from."""
    named = [config[k] for k in ("test_split", "validation_split", "training_split", "fewshot_split")
             if isinstance(config.get(k), str)]
    shots_cfg = config.get("fewshot_config") if isinstance(config.get("fewshot_config"), dict) else {}
    if isinstance(shots_cfg.get("split"), str):
        named.append(shots_cfg["split"])
    scored = config.get("test_split") or config.get("validation_split")
    if not isinstance(scored, str):
        raise BadInput(f"{name}: its lm-eval config names no test_split or validation_split to score")
    cols, code = _columns(config, config.get("process_docs"))
    needs = [SplitNeed(scored, cols, f"the rows {name} scores", code)]
    shots = config.get("num_fewshot") or 0
    if isinstance(shots, int) and shots > 0 and shots_cfg.get("samples") is None:
        source = (shots_cfg.get("split") or config.get("fewshot_split") or config.get("training_split")
                  or config.get("validation_split") or scored)
        if source != scored:
            fs_cfg = {k: shots_cfg.get(k) or config.get(k) for k in _JINJA_FIELDS}
            cols, code = _columns(fs_cfg, shots_cfg.get("process_docs") or config.get("process_docs"))
            needs.append(SplitNeed(source, cols, f"its {shots}-shot examples", code))
    return needs, list(dict.fromkeys(named))


def _columns(config: dict[str, Any], process_docs: Any) -> tuple[tuple[str, ...], bool]:
    """(the columns the templates of `config` read, whether the task's own code reads rows too).

    With a `process_docs` the templates read its output, not the file, so none is claimed; a
    template with `x is defined` reads what the row has, so it claims none either."""
    if isinstance(process_docs, FunctionRef):
        return (), True

    env, out, code = jinja2.Environment(), set(), False
    for key in _JINJA_FIELDS:
        value = config.get(key)
        if isinstance(value, FunctionRef):
            code = True
        elif not isinstance(value, str) or re.search(r"\bis\s+(not\s+)?defined\b", value):
            continue
        elif key in _TEMPLATE_FIELDS and _IDENTIFIER.fullmatch(value):
            out.add(value)
        elif "{{" in value or "{%" in value:
            out |= jinja2.meta.find_undeclared_variables(env.parse(value))
    return tuple(sorted(out)), code


# --------------------------------------------------------------------------- the checks

class UnknownTaskError(BadInput):
    """A task name neither lm-eval nor eval/benchmarks/ knows."""


def check_standard(spec: TaskSpec, local: list[str]) -> StandardTask:
    """`spec` (a name that is not one of the `local` tasks or tags) checked against lm-eval's YAML and
    its folder; BadInput (UnknownTaskError for a name lm-eval does not declare) otherwise."""
    path = find_task_yaml(spec.name)
    if path is None:
        raise unknown_task(spec.name, local)
    config = task_config(path)
    if "class" in config:
        raise BadInput(f"{spec.name} is a Python-class lm-eval task: local data replaces the dataset of YAML tasks only")
    folder = path.parent.relative_to(tasks_root()).as_posix()
    needs_code = next((n for f, n in CODE_NEEDS.items() if folder == f or folder.startswith(f + "/")), CodeNeeds())
    missing = _missing_code(needs_code)
    if missing:
        raise BadInput(f"{spec.name} needs, on this machine and offline: {'; '.join(missing)}")
    needs, named = split_needs(config, spec.name)
    if needs_code.columns:
        first = needs[0]
        needs[0] = SplitNeed(first.split, tuple(sorted({*first.columns, *needs_code.columns})), first.why)
    if spec.data is None:
        raise BadInput(f"{spec.name} is a standard lm-eval task and nothing is downloaded: write {spec.name}@FOLDER, "
                       f"a folder holding {provide(needs, path)}")
    folder_path = Path(spec.data).expanduser()
    where = f"{spec.text}:"
    if not folder_path.is_dir():
        raise BadInput(f"{where} no folder {folder_path.resolve()} (relative to the current directory); "
                       f"it must hold {provide(needs, path)}")
    files = split_files(folder_path)
    problems = [f"{_names(ps)} is not a split {spec.name} reads ({', '.join(named)})"
                for s, ps in files.items() if s not in named]
    problems += [f"split {s} is given as both {_names(ps)}; keep one kind"
                 for s, ps in files.items() if len({p.suffix for p in ps}) > 1]
    absent = [n for n in needs if n.split not in files]
    if absent:
        problems.append(f"provide {provide(absent, path)}")
    for n in needs:
        for p in files.get(n.split, []):
            problems += _file_problems(p, n.columns)
    if problems:
        raise BadInput([f"{where} {p}" for p in problems] if len(problems) > 1 else f"{where} {problems[0]}")
    return StandardTask(spec, path, config, {s: [p.resolve() for p in ps] for s, ps in files.items() if s in named})


def provide(needs: list[SplitNeed], yaml_path: Path) -> str:
    """`test.jsonl or test.parquet (the rows gsm8k scores) with columns answer, question; train...`."""
    parts = []
    for n in needs:
        cols = [f"columns {', '.join(n.columns)}"] if n.columns else []
        cols += [f"the columns its own code reads (see {yaml_path.parent})"] if n.code else []
        parts.append(f"{n.split}{SUFFIXES[0]} or {n.split}{SUFFIXES[1]} ({n.why})" + (f" with {' and '.join(cols)}" if cols else ""))
    return "; ".join(parts)


def _names(paths: list[Path]) -> str:
    return ", ".join(p.name for p in paths)


def _file_problems(path: Path, columns: tuple[str, ...]) -> list[str]:
    try:
        row = first_row(path)
    except (ValueError, OSError) as e:
        return [f"{path.name}: {e}"]
    except Exception as e:  # a Parquet file pyarrow cannot read
        return [f"{path.name}: cannot read it ({type(e).__name__}: {e})"]
    if row is None:
        return [f"{path.name} has no rows"]
    lacking = [c for c in columns if c not in row]
    if lacking:
        return [f"{path.name} lacks column(s) {', '.join(lacking)} (it has {', '.join(row) or 'none'})"]
    return []


def _missing_code(needs: CodeNeeds) -> list[str]:
    """What of `needs` this machine lacks, each with how to provide it (nothing is fetched here)."""
    out = []
    for req in needs.packages:
        dist, _, floor = req.partition(">=")
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out.append(f"Python package {req} (pip install '{req}')")
            continue
        if floor and _version(have) < _version(floor):
            out.append(f"Python package {req} (installed: {have})")
    if needs.nltk_data and importlib.util.find_spec("nltk") is not None:
        import nltk  # noqa: PLC0415 (nltk: 1.2 s to import, only for the one task that needs it)

        for res in needs.nltk_data:
            try:
                nltk.data.find(res)
            except LookupError:
                out.append(f"NLTK data {res} (download it where there is a network: python -m nltk.downloader "
                           f"{res.rsplit('/', 1)[-1]}, and copy nltk_data/ here or point NLTK_DATA at it; "
                           f"searched: {', '.join(nltk.data.path[:3])}, ...)")
    return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def unknown_task(name: str, local: list[str]) -> BadInput:
    """A name neither eval/benchmarks/ nor lm-eval's YAMLs declare as a task (a group, or unknown: the close names)."""
    if is_group(name):
        return BadInput(f"{name} is a group of lm-eval tasks, each with its own dataset: list its tasks one by one, "
                        f"each as TASK@FOLDER")
    near = difflib.get_close_matches(name, local + standard_names(), n=3)
    hint = f" (nearest: {', '.join(near)})" if near else ""
    return UnknownTaskError(f"unknown lm-eval task {name}{hint}; local tasks: {', '.join(local)}")


