"""The recipe: one YAML file naming a model, its data and its stages.

    loaded = load_recipe("recipes/tiny.yaml", ["stages.pretrain.tokens=491520"])
    loaded.recipe.stages.pretrain.seq_length; recipe_hash(loaded.recipe)

This module holds the typed schema (composed from the libraries' own configs) and
the loader: `base:` inheritance (mappings merge, lists are replaced whole), `--set a.b[1].c=v`
overrides checked against the schema, `${name}`/`${seed}` in the workdir, and validation in
full before any work starts. A RecipeError lists every problem as
`<yaml.path>: <why> (<file>:<line>)`, because a user fixes a recipe in an editor, not in a
traceback. Cross-field checks live here (not in the libraries' configs) so each one can
name the exact field that breaks it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from data.config import WORLD_PREFIX, DataConfig, PhaseConfig, TokenizerConfig
from data.sft_config import SFTBlend, SFTDataConfig
from eval.gates import GateConfig
from flows.stage_schemas import LongContextStage, MergeStage
from model.config import LoRAConfig, ModelConfig, TrainConfig


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, populate_by_name=True)


class TrackingConfig(_Config):
    """Where MLflow records go."""

    uri: str | None = None
    """MLflow tracking URI; default a SQLite store at <workdir>/mlflow.db."""
    experiment: str | None = None
    """MLflow experiment; default the recipe name."""


class PretrainStage(TrainConfig):
    """Phased pretraining: one LR schedule over the stage, blends switching at token fractions."""

    phases: list[PhaseConfig] = Field(min_length=1)
    """The curriculum: e.g. a diversity blend until 0.8, then a quality blend until 1.0."""
    val_tokens: int = Field(65536, gt=0)
    """Held-out tokens scored for the validation loss (per evaluation)."""
    eval_suite: str | None = None
    """An eval suite (recipe `eval` block) run at each phase end and gate mark, besides validation loss."""
    gate: GateConfig | None = None
    """Stop the stage early when this rule holds on its evaluations (see eval/gates.py)."""


class SFTSubStage(TrainConfig):
    """One SFT sub-stage: its blend, packs (seq_length is the pack size), loss normalisation, LR schedule."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Sub-stage name: its MLflow run, metric prefix `sft/<name>/...` and stage directory."""
    normalization: Literal["token", "conversation"] = "token"
    """Loss normalisation (ALGORITHMS.md 4): token (every supervised token weighs the same) or
    conversation (every conversation weighs the same, however long)."""
    blend: SFTBlend
    """Domain weights, conversation count and reasoning-off fraction of this sub-stage's sample."""
    keep_previous: float = Field(0.0, ge=0, le=1)
    """Share of the previous sub-stage's sample trained on again here, added to this blend's sample
    (so a later sub-stage does not forget the earlier one's data)."""
    max_epochs: float | None = Field(None, gt=0)
    """Passes over the packed rows at most (None: as many as the token budget needs)."""
    eval_suite: str | None = None
    """An eval suite (recipe `eval` block) run at this sub-stage's gate marks, besides the held-out conversations."""
    gate: GateConfig | None = None
    """Stop the sub-stage early when this rule holds on its evaluations (see eval/gates.py)."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters only; every checkpoint is saved merged (a plain model)."""


class SFTStage(_Config):
    """Supervised fine-tuning: curate conversations, then train one or more sub-stages in turn."""

    data: SFTDataConfig
    """Sources, curation and the optional demo-world conversations."""
    stages: list[SFTSubStage] = Field(min_length=1)
    """Sub-stages in order, each starting from the previous one's checkpoint
    (e.g. short packs and token normalisation, then long packs and conversation normalisation)."""
    eval_suite: str | None = None
    """An eval suite scored on the starting (base) model and after every sub-stage: the
    before/after comparison logged as `sft/<task>/<metric>_delta`."""
    eval_limit: int | None = Field(None, gt=0)
    """Items per task of eval_suite (None: all)."""


class StagesConfig(_Config):
    """One optional block per stage; a stage runs when its block is present."""

    pretrain: PretrainStage | None = None
    """Phased pretraining."""
    merge: MergeStage | None = None
    """Merge pretraining checkpoints over windows (decay emulation) and hand on the best."""
    long_context: LongContextStage | None = None
    """Long-context continued pretraining from the (merged) pretraining checkpoint."""
    sft: SFTStage | None = None
    """Supervised fine-tuning on curated, packed conversations (after pretraining)."""


class Recipe(_Config):
    """A whole training recipe."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Recipe name; also the MLflow experiment unless tracking.experiment is set."""
    seed: int = 1234
    """Seeds data generation, sampling, initialisation and dropout."""
    workdir: str = "runs/${name}"
    """Where data, checkpoints and the default MLflow store live (relative to the current directory)."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """MLflow settings."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The network."""
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """The tokenizer."""
    data: DataConfig
    """Pretraining sources."""
    eval: dict[str, list[str]] = Field(default_factory=dict)
    """Named evaluation suites: suite name -> task names."""
    stages: StagesConfig = Field(default_factory=StagesConfig)
    """The stages to run, in pipeline order."""

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> "Recipe":
        # Checks that span libraries. The loader passes a list in the context to collect each
        # problem with its own YAML path; a plain model_validate raises them all at once.
        problems = _cross_problems(self)
        sink = (info.context or {}).get("problems")
        if sink is not None:
            sink.extend(problems)
        elif problems:
            raise ValueError("; ".join(f"{path}: {why}" for path, why, _ in problems))
        return self


def _cross_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """(yaml path, why, path whose line to cite) for every cross-field problem of a recipe."""
    pre = r.stages.pretrain
    out = _source_problems([s.name for s in r.data.sources], pre.phases if pre else None, r.tokenizer)
    out += _schedule_problems("stages.pretrain", pre) if pre else []
    out += _suite_problems(r, "stages.pretrain", pre)
    out += _sft_problems(r) if r.stages.sft else []
    out += _merge_problems(r)
    out += _suite_problems(r, "stages.merge", r.stages.merge)
    return out + _preset_problems(r.model)


def _merge_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """Merging and long context build on pretraining: its checkpoints, data and last blend."""
    out = []
    pre = r.stages.pretrain
    for name in ("merge", "long_context"):
        if getattr(r.stages, name) is not None and pre is None:
            out.append((f"stages.{name}", "needs a stages.pretrain block (it starts from pretraining)", f"stages.{name}"))
    if r.stages.merge is not None and pre is not None:
        if not pre.checkpoint_every_tokens:
            out.append(("stages.pretrain.checkpoint_every_tokens",
                        "must be set when stages.merge is (merging needs intermediate checkpoints)", "stages.merge"))
        elif pre.keep_checkpoints:
            kept = pre.keep_checkpoints * pre.checkpoint_every_tokens
            for i, w in enumerate(r.stages.merge.windows_tokens):
                if w > kept:
                    at = f"stages.merge.windows_tokens[{i}]"
                    out.append((at, f"window of {w} tokens is longer than the {kept} tokens of checkpoints "
                                    "stages.pretrain.keep_checkpoints keeps", at))
    return out


def _suite_problems(r: Recipe, at: str, stage: Any) -> list[tuple[str, str, str]]:
    """A stage's eval_suite and gate.suite must name suites of the recipe's `eval` block."""
    out = []
    for field, name in (("eval_suite", getattr(stage, "eval_suite", None)),
                        ("gate.suite", getattr(getattr(stage, "gate", None), "suite", None))):
        if name is not None and name not in r.eval:
            where = f"{at}.{field}"
            known = ", ".join(sorted(r.eval)) or "none; add an `eval:` block"
            out.append((where, f"unknown eval suite {name!r}{_did_you_mean(name, r.eval)}; suites: {known}", where))
    return out


SFT_WORLD_FILES = ("sft_arithmetic.jsonl", "sft_calculator.jsonl", "sft_sorting.jsonl", "sft_lookup.jsonl",
                   "sft_format.jsonl", "sft_long_context.jsonl", "sft_dirty.jsonl")
"""What `stages.sft.data.world` writes that a source may train on (sft_eval.jsonl is held out)."""


def _sft_problems(r: Recipe) -> list[tuple[str, str, str]]:
    """Sources, blends, keep_previous, schedules and suites of `stages.sft`."""
    sft, at = r.stages.sft, "stages.sft"
    out = _sft_source_problems(sft.data, f"{at}.data")
    domains = sorted({s.domain_name for s in sft.data.sources})
    out += _suite_problems(r, at, sft)
    seen: set[str] = set()
    for i, sub in enumerate(sft.stages):
        here = f"{at}.stages[{i}]"
        if sub.name in seen:
            out.append((f"{here}.name", f"duplicate sub-stage name {sub.name!r}", f"{here}.name"))
        seen.add(sub.name)
        for domain in sub.blend.weights:
            if domain not in domains:
                why = f"unknown domain {domain!r}{_did_you_mean(domain, domains)}; the sources' domains: {', '.join(domains)}"
                out.append((f"{here}.blend.weights.{domain}", why, f"{here}.blend.weights.{domain}"))
        if i == 0 and sub.keep_previous > 0:
            why = f"the first sub-stage has no previous one to keep data from; got {sub.keep_previous}"
            out.append((f"{here}.keep_previous", why, f"{here}.keep_previous"))
        out += _schedule_problems(here, sub)
        out += _suite_problems(r, here, sub)
    return out


def _sft_source_problems(data: SFTDataConfig, at: str) -> list[tuple[str, str, str]]:
    """Unique source names; `@world/` paths need the world block and name a file it writes."""
    out, seen = [], set()
    for i, src in enumerate(data.sources):
        here = f"{at}.sources[{i}]"
        if src.name in seen:
            out.append((f"{here}.name", f"duplicate source name {src.name!r}", f"{here}.name"))
        seen.add(src.name)
        out += _sft_world_path_problems(f"{here}.path", src.path, data, training=True)
    if data.heldout is not None:
        out += _sft_world_path_problems(f"{at}.heldout", data.heldout, data, training=False)
    return out


def _sft_world_path_problems(where: str, path: str, data: SFTDataConfig, training: bool) -> list[tuple[str, str, str]]:
    if not path.startswith(WORLD_PREFIX):
        return []
    if data.world is None:
        return [(where, f"{WORLD_PREFIX} paths need a `world` block in stages.sft.data (it generates them)", where)]
    name = path[len(WORLD_PREFIX):]
    if training and name == "sft_eval.jsonl":
        return [(where, "sft_eval.jsonl is the held-out set: it is scored, never trained on", where)]
    files = SFT_WORLD_FILES + (() if training else ("sft_eval.jsonl",))
    if name not in files:
        return [(where, f"the SFT world writes no {name!r}{_did_you_mean(name, files)}; files: {', '.join(files)}", where)]
    return []


def _preset_problems(model: ModelConfig) -> list[tuple[str, str, str]]:
    """A preset name must exist (checked here so a typo fails before any work starts)."""
    from model.presets import preset_names  # reads JSON files only; no torch

    names = preset_names()
    if model.from_ is not None or model.preset is None or model.preset in names:
        return []
    why = f"unknown preset {model.preset!r}{_did_you_mean(model.preset, names)}; presets: {', '.join(names)}"
    return [("model.preset", why, "model.preset")]


def _source_problems(names: list[str], phases: list[PhaseConfig] | None,
                     tokenizer: TokenizerConfig | None) -> list[tuple[str, str, str]]:
    """Phases and the tokenizer may only name sources the data block defines."""
    out = _phase_problems("stages.pretrain.phases", phases, names) if phases else []
    for i, name in enumerate((tokenizer.train_sources if tokenizer else None) or []):
        if name not in names:
            at = f"tokenizer.train_sources[{i}]"
            out.append((at, f"unknown source {name!r}{_did_you_mean(name, names)}", at))
    return out


def _partial_cross_problems(raw: dict) -> list[tuple[str, str, str]]:
    """Cross checks on the parts that validate alone, so one bad field hides no other problem."""
    def part(model: type[BaseModel], value: Any) -> Any:
        try:
            return model.model_validate(value)
        except (ValidationError, TypeError):
            return None

    sources = (raw.get("data") or {}).get("sources") if isinstance(raw.get("data"), dict) else None
    if not isinstance(sources, list):
        return []
    names = [s["name"] for s in sources if isinstance(s, dict) and isinstance(s.get("name"), str)]
    pre = (raw.get("stages") or {}).get("pretrain")
    phases = [part(PhaseConfig, p) for p in pre.get("phases") or []] if isinstance(pre, dict) else []
    phases = phases if phases and None not in phases and isinstance(pre.get("phases"), list) else None
    return _source_problems(names, phases, part(TokenizerConfig, raw.get("tokenizer") or {}))


def _phase_problems(at: str, phases: list[PhaseConfig], names: list[str]) -> list[tuple[str, str, str]]:
    """The rules of data.config.check_phases, each reported at the phase that breaks it."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for i, p in enumerate(phases):
        here = f"{at}[{i}]"
        if p.name in seen:
            out.append((f"{here}.name", f"duplicate phase name {p.name!r}", f"{here}.name"))
        seen.add(p.name)
        if i and p.until <= phases[i - 1].until:
            why = f"must be greater than the previous phase's until ({phases[i - 1].until}); got {p.until}"
            out.append((f"{here}.until", why, f"{here}.until"))
        for src in p.blend:
            if src not in names:
                why = f"unknown source {src!r}{_did_you_mean(src, names)}; known: {', '.join(sorted(names))}"
                out.append((f"{here}.blend", why, f"{here}.blend.{src}"))
    if phases[-1].until != 1.0:
        last = f"{at}[{len(phases) - 1}].until"
        out.append((last, f"the last phase must end at 1.0; got {phases[-1].until}", last))
    return out


def _schedule_problems(at: str, stage: TrainConfig) -> list[tuple[str, str, str]]:
    """Warmup and decay must fit inside the stage's token budget."""
    sched, out = stage.schedule, []
    if sched.warmup_tokens >= stage.tokens:
        why = f"must be less than the stage's tokens ({stage.tokens}); got {sched.warmup_tokens}"
        out.append((f"{at}.schedule.warmup_tokens", why, f"{at}.schedule.warmup_tokens"))
    elif sched.kind == "wsd" and sched.decay_tokens is not None:
        if sched.warmup_tokens + sched.decay_tokens > stage.tokens:
            why = (f"warmup_tokens + decay_tokens ({sched.warmup_tokens + sched.decay_tokens}) "
                   f"exceed the stage's tokens ({stage.tokens})")
            out.append((f"{at}.schedule.decay_tokens", why, f"{at}.schedule.decay_tokens"))
    return out


def _did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


# --------------------------------------------------------------------------- stages

STAGE_ORDER = ("pretrain", "merge", "long_context", "sft", "rl", "distill", "quantize")
"""Every stage the design names, in pipeline order; later issues add the missing blocks."""


def available_stages() -> list[str]:
    """Stages this version can run (the blocks StagesConfig has)."""
    return [s for s in STAGE_ORDER if s in StagesConfig.model_fields]


def _not_yet(stage: str) -> str:
    return f"stage {stage!r} is not available yet in this version (available: {', '.join(available_stages())})"


class _PathError(ValueError):
    """A YAML path that the schema does not have: where and why."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def select_stages(recipe: Recipe, names: str | typing.Sequence[str] | None) -> list[str] | None:
    """`--stages a,b` checked against the recipe, returned in pipeline order (None: all present)."""
    if names is None:
        return None
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    problems = []
    for n in wanted:
        if n not in STAGE_ORDER:
            problems.append(f"--stages: unknown stage {n!r}{_did_you_mean(n, STAGE_ORDER)}")
        elif n not in available_stages():
            problems.append(f"--stages: {_not_yet(n)}")
        elif getattr(recipe.stages, n) is None:
            problems.append(f"--stages: the recipe has no stages.{n} block")
    if problems or not wanted:
        raise RecipeError(problems or ["--stages: name at least one stage"])
    return [s for s in STAGE_ORDER if s in wanted]


# --------------------------------------------------------------------------- loader

class RecipeError(ValueError):
    """A recipe that cannot be used; str() is the whole message a user sees (no traceback needed)."""

    def __init__(self, problems: str | list[str], title: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = [title, *(f"  {p}" for p in self.problems)] if title else self.problems
        super().__init__("\n".join(lines))


@dataclasses.dataclass
class LoadedRecipe:
    """A validated recipe with where it came from (for relative paths and error messages)."""

    recipe: Recipe
    path: Path
    """The top-level recipe file (absolute)."""
    raw: dict
    """The merged YAML after `base:` inheritance and `--set` overrides, before defaults."""
    sources: dict[str, tuple[str, int]]
    """YAML path -> (file, line) of the value's definition; line 0 marks a `--set` override."""

    @property
    def base_dir(self) -> Path:
        """Directory relative source paths resolve against."""
        return self.path.parent


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-3` as a float (YAML 1.1 insists on a dot)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _join(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))


def _parse_path(text: str) -> list[str | int]:
    """`a.b[1].c` -> ['a', 'b', 1, 'c']; raises ValueError on a malformed path."""
    tokens: list[str | int] = []
    for part in text.split("."):
        m = re.fullmatch(r"([^\[\]]+)((?:\[-?\d+\])*)", part)
        if not m:
            raise ValueError(f"malformed path {text!r}")
        tokens.append(m.group(1))
        tokens += [int(i) for i in re.findall(r"\[(-?\d+)\]", m.group(2))]
    return tokens


def _show(file: str) -> str:
    """A file as the user should read it: relative to the current directory when inside it."""
    try:
        rel = os.path.relpath(file)
        return file if rel.startswith("..") else rel
    except ValueError:
        return file


def _locate(path: str, sources: dict[str, tuple[str, int]], default: str) -> tuple[str, int]:
    """(file, line) of the closest defined ancestor of a YAML path (line 0: no line)."""
    tokens = _parse_path(path) if path else []
    while tokens:
        at = ""
        for t in tokens:
            at = _join(at, t)
        if at in sources:
            return sources[at]
        tokens.pop()
    return default, 0


def _where(located: tuple[str, int]) -> str:
    file, line = located
    return f"{_show(file)}:{line}" if line else _show(file)


def _read_yaml(path: Path) -> tuple[dict, dict[str, tuple[str, int]]]:
    """One YAML mapping and the line of every key / sequence item in it."""
    loader = _Loader(path.read_text())
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{_show(str(path))}:{mark.line + 1}" if mark else _show(str(path))
        raise RecipeError([f"{where}: invalid YAML: {getattr(e, 'problem', None) or e}"]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise RecipeError([f"{_show(str(path))}: a recipe must be a YAML mapping (key: value lines)"])
    lines: dict[str, tuple[str, int]] = {}
    dups: list[str] = []
    _walk_lines(node, "", str(path), lines, dups)
    if dups:
        raise RecipeError(dups, f"invalid recipe {_show(str(path))}:")
    return data, lines


def _walk_lines(node, path: str, file: str, out: dict, dups: list[str]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            key = _join(path, str(k.value))
            if key in seen:
                dups.append(f"{key}: duplicate key ({_show(file)}:{k.start_mark.line + 1})")
            seen.add(key)
            out[key] = (file, k.start_mark.line + 1)
            _walk_lines(v, key, file, out, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = _join(path, i)
            out[key] = (file, item.start_mark.line + 1)
            _walk_lines(item, key, file, out, dups)


def _deep_merge(base: Any, over: Any) -> Any:
    """Mappings merge key by key; anything else (lists included) is replaced whole."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v) if k in base else v
        return out
    return over


def _replaced_paths(data: Any, path: str = "") -> Iterator[str]:
    """Paths whose value replaces whatever a base defined there (every non-mapping value)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _replaced_paths(v, _join(path, str(k)))
    elif path:
        yield path


def _drop_under(sources: dict, path: str) -> None:
    for k in [k for k in sources if k.startswith(path + ".") or k.startswith(path + "[")]:
        del sources[k]


def _load_tree(path: Path, chain: tuple[Path, ...]) -> tuple[dict, dict[str, tuple[str, int]]]:
    """A recipe file merged over its `base:` chain, with the origin of every value."""
    if path in chain:
        cycle = " -> ".join(_show(str(p)) for p in (*chain[chain.index(path):], path))
        raise RecipeError([f"base: inheritance cycle: {cycle}"])
    data, lines = _read_yaml(path)
    base = data.pop("base", None)
    base_line = lines.pop("base", (str(path), 0))
    if base is None:
        return data, lines
    where = f"{_show(str(path))}:{base_line[1]}"
    if not isinstance(base, str):
        raise RecipeError([f"base: must be a file name relative to this recipe ({where})"])
    base_path = (path.parent / base).resolve()
    if not base_path.is_file():
        raise RecipeError([f"base: file not found: {_show(str(base_path))} ({where})"])
    base_data, sources = _load_tree(base_path, (*chain, path))
    for p in _replaced_paths(data):
        _drop_under(sources, p)
    sources.update(lines)
    return _deep_merge(base_data, data), sources


# --------------------------------------------------------------------------- schema walking

def _unwrap(tp: Any) -> list[Any]:
    """The concrete types behind Optional/Union/Annotated."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(tp) if a is not type(None) for t in _unwrap(a)]
    return [tp]


def _model_keys(model: type[BaseModel]) -> dict[str, str]:
    """YAML key -> field name (aliases included) of a pydantic model."""
    keys = {}
    for name, f in model.model_fields.items():
        keys[name] = name
        if f.alias:
            keys[f.alias] = name
    return keys


def _child_type(tp: Any, token: str | int, at: str) -> Any:
    """The schema type one step below `tp`; raises _PathError naming the nearest valid key."""
    for t in _unwrap(tp):
        if t is Any:
            return Any
        if isinstance(t, type) and issubclass(t, BaseModel):
            keys = _model_keys(t)
            if isinstance(token, str) and token in keys:
                return t.model_fields[keys[token]].annotation
            if t is StagesConfig and token in STAGE_ORDER:
                raise _PathError(_join(at, token), _not_yet(str(token)))
            hint = _did_you_mean(str(token), keys) or f"; valid keys: {', '.join(sorted(keys))}"
            raise _PathError(_join(at, token), f"unknown key{hint}")
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is list and isinstance(token, int):
            return args[0] if args else Any
        if origin is tuple and isinstance(token, int):
            return args[0] if args[-1:] == (Ellipsis,) else args[min(token, len(args) - 1)]
        if origin is dict and isinstance(token, str):
            return args[1] if args else Any
    raise _PathError(_join(at, token), f"{at or 'the recipe'} holds a single value, not {token!r}")


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The pydantic model at a validated location (pydantic's loc tuple), if any."""
    tp: Any = Recipe
    at = ""
    try:
        for token in path:
            tp = _child_type(tp, token, at)
            at = _join(at, token)
    except _PathError:
        return None
    models = [t for t in _unwrap(tp) if isinstance(t, type) and issubclass(t, BaseModel)]
    return models[0] if models else None


# --------------------------------------------------------------------------- overrides

def _apply_override(raw: dict, sources: dict, text: str) -> None:
    """Apply one `a.b[1].c=value` (value parsed as YAML) to the merged recipe, in place."""
    key, eq, value_text = text.partition("=")
    if not eq or not key.strip():
        raise ValueError(f"--set {text}: expected key=value, e.g. stages.pretrain.tokens=500000")
    try:
        tokens = _parse_path(key.strip())
        value = yaml.load(value_text, Loader=_Loader) if value_text.strip() else None
    except (ValueError, yaml.YAMLError) as e:
        raise ValueError(f"--set {text}: {getattr(e, 'problem', None) or e}") from None
    tp: Any = Recipe
    node: Any = raw
    at = ""
    for i, token in enumerate(tokens):
        try:
            tp = _child_type(tp, token, at)
        except _PathError as e:
            raise ValueError(f"{e.path}: {e.why} (--set {text})") from None
        last = i == len(tokens) - 1
        if isinstance(token, int):
            if not isinstance(node, list) or not -len(node) <= token < len(node):
                size = len(node) if isinstance(node, list) else 0
                raise ValueError(f"{_join(at, token)}: index out of range; {at} has {size} item(s) (--set {text})")
            token = token % len(node)
        elif not isinstance(node, dict):
            raise ValueError(f"{_join(at, token)}: {at} is not a mapping (--set {text})")
        at = _join(at, token)
        if last:
            node[token] = value
        else:
            child = node[token] if isinstance(token, int) else node.get(token)
            if child is None:
                node[token] = child = {}
            node = child
    _drop_under(sources, at)
    sources[at] = (f"--set {text}", 0)


# --------------------------------------------------------------------------- validation

_COMPARE = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
            "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}


def _friendly(err: dict) -> str:
    """pydantic's message rewritten for a recipe author (no URL, no 'Input should be')."""
    kind, ctx, msg = err["type"], err.get("ctx") or {}, err["msg"]
    if kind in _COMPARE:
        op, key = _COMPARE[kind]
        return f"must be {op} {ctx[key]}"
    if kind == "missing":
        return "required; add it to the recipe"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", msg))
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')} (letters, digits, _ . -); got {err['input']!r}"
    msg = msg.replace("Input should be", "must be").replace("Input should have", "must have")
    msg = msg.split(", unable to")[0]
    inp = err.get("input")
    if isinstance(inp, (str, int, float, bool)) or inp is None:
        msg += f"; got {inp!r}"
    return msg


def _pydantic_problem(err: dict) -> tuple[str, str, str]:
    """(path, why, line path) for one pydantic error."""
    loc = tuple(t for t in err["loc"] if t != "[key]")
    path = ""
    for t in loc:
        path = _join(path, t)
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        name = str(loc[-1])
        if parent is StagesConfig and name in STAGE_ORDER:
            return path, _not_yet(name), path
        keys = _model_keys(parent) if parent else {}
        return path, f"unknown key{_did_you_mean(name, keys)}", path
    why = _friendly(err)
    model = _model_at(loc)
    if err["type"] == "value_error" and model is not None:
        # A model-level check names its field first or in backticks: cite that field.
        words = [why.split(" ")[0], *re.findall(r"`([^`]+)`", why)]
        for w in words:
            if w in _model_keys(model):
                path = _join(path, w)
                break
    return path, why, path


def _interpolate(value: str, recipe: Recipe) -> str:
    """`${name}` / `${seed}` in the workdir."""
    return re.sub(r"\$\{(name|seed)\}", lambda m: str(getattr(recipe, m.group(1))), value)


def _rebase_sources(raw: dict, sources: dict, top: Path) -> None:
    """Relative source paths inherited from a base in another folder stay relative to that base."""
    sft = ((raw.get("stages") or {}).get("sft") or {}) if isinstance(raw.get("stages"), dict) else {}
    sft_data = sft.get("data") if isinstance(sft, dict) and isinstance(sft.get("data"), dict) else {}
    for at, items in (("data.sources", (raw.get("data") or {}).get("sources")),
                      ("stages.sft.data.sources", sft_data.get("sources"))):
        for i, src in enumerate(items if isinstance(items, list) else []):
            p = src.get("path") if isinstance(src, dict) else None
            file, line = sources.get(f"{at}[{i}].path", ("", 0))
            if not isinstance(p, str) or not line or p.startswith(WORLD_PREFIX) or os.path.isabs(p):
                continue
            if Path(file).parent != top.parent:
                src["path"] = os.path.relpath(Path(file).parent / p, top.parent)


def load_recipe(path: str | Path, overrides: typing.Sequence[str] = ()) -> LoadedRecipe:
    """Read a recipe with its `base:` chain, apply `--set` overrides, validate it in full.

    Raises RecipeError listing every problem as `<yaml.path>: <why> (<file>:<line>)`.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise RecipeError([f"recipe file not found: {_show(str(path))}"])
    raw, sources = _load_tree(path, ())
    _rebase_sources(raw, sources, path)
    lines = []  # bad overrides are reported with the validation problems of the rest
    for text in overrides:
        try:
            _apply_override(raw, sources, text)
        except ValueError as e:
            lines.append(str(e))
    problems: list[tuple[str, str, str]] = []
    workdir = raw.get("workdir")
    if isinstance(workdir, str):
        for var in re.findall(r"\$\{([^}]*)\}", workdir):
            if var not in ("name", "seed"):
                problems.append(("workdir", f"unknown variable ${{{var}}}; only ${{name}} and ${{seed}} are replaced", "workdir"))
    recipe = None
    try:
        recipe = Recipe.model_validate(raw, context={"problems": problems})
    except ValidationError as e:
        problems += [_pydantic_problem(err) for err in e.errors(include_url=False)]
        seen = {p for p, _, _ in problems}
        problems += [p for p in _partial_cross_problems(raw) if p[0] not in seen]
    located = sorted(((_locate(where, sources, str(path)), p, why) for p, why, where in problems),
                     key=lambda x: (x[0][1] == 0, x[0]))  # in file order, so they read top to bottom
    lines += [f"{p}: {why} ({_where(loc)})" for loc, p, why in located]
    if lines:
        n = len(lines)
        raise RecipeError(lines, f"invalid recipe {_show(str(path))} ({n} problem{'s' * (n != 1)}):")
    assert recipe is not None
    recipe = recipe.model_copy(update={"workdir": _interpolate(recipe.workdir, recipe)})
    return LoadedRecipe(recipe=recipe, path=path, raw=raw, sources=sources)


# --------------------------------------------------------------------------- hashing and params

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
