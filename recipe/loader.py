"""Loading a recipe: its YAML (with `base:`), `--set` overrides, validation, readable errors.

    loaded = load_recipe("recipes/tiny.yaml", ["stages.pretrain.tokens=491520"])

load_recipe() reads the file and its `base:` chain (recipe/yaml_source.py), applies
`--set a.b[1].c=v` overrides checked against the schema (recipe/schema.py), validates
in full before any work starts, and replaces `${name}`/`${seed}` in the workdir. Every
problem, pydantic's included, is rewritten as `<yaml.path>: <why> (<file>:<line>)` and all of
them are raised together in one RecipeError.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from stagewise.data.config import WORLD_PREFIX
from stagewise.engines.checks import engine_problems
from stagewise.recipe.checks import cross_problems, partial_cross_problems
from stagewise.recipe.errors import RecipeError, cite_location, did_you_mean, join_path, locate, parse_path, show_file
from stagewise.recipe.schema import Recipe
from stagewise.recipe.yaml_source import YamlLoader, drop_under, load_tree


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


class _PathError(ValueError):
    """A YAML path that the schema does not have: where and why."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


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
            hint = did_you_mean(str(token), keys) or f"; valid keys: {', '.join(sorted(keys))}"
            raise _PathError(join_path(at, token), f"unknown key{hint}")
        origin, args = typing.get_origin(t), typing.get_args(t)
        if origin is list and isinstance(token, int):
            return args[0] if args else Any
        if origin is tuple and isinstance(token, int):
            return args[0] if args[-1:] == (Ellipsis,) else args[min(token, len(args) - 1)]
        if origin is dict and isinstance(token, str):
            return args[1] if args else Any
    raise _PathError(join_path(at, token), f"{at or 'the recipe'} holds a single value, not {token!r}")


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The pydantic model at a validated location (pydantic's loc tuple), if any."""
    tp: Any = Recipe
    at = ""
    try:
        for token in path:
            tp = _child_type(tp, token, at)
            at = join_path(at, token)
    except _PathError:
        return None
    models = [t for t in _unwrap(tp) if isinstance(t, type) and issubclass(t, BaseModel)]
    return models[0] if models else None


# --------------------------------------------------------------------------- shape

def _kind(value: Any) -> str:
    """How a YAML value reads to its author: `a mapping`, `a list`, `a string 'x'`, ..."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"a boolean {value!r}"
    if isinstance(value, (int, float)):
        return f"a number {value!r}"
    if isinstance(value, str):
        return f"a string {value[:40]!r}"
    return f"a {type(value).__name__}"


def _shape_problems(value: Any, tp: Any, at: str) -> list[tuple[str, str, str]]:
    """Where the schema wants a mapping or a list and the YAML has something else.

    Runs before any code walks the merged YAML (source paths, phase lists, partial checks), so
    that code sees a mapping where it expects one; pydantic then reports the rest.
    """
    types = _unwrap(tp)
    if value is None or Any in types:
        return []  # null: pydantic says whether the field may be empty
    models = [t for t in types if isinstance(t, type) and issubclass(t, BaseModel)]
    maps = [t for t in types if t is dict or typing.get_origin(t) is dict]
    seqs = [t for t in types if t in (list, tuple) or typing.get_origin(t) in (list, tuple)]
    only_containers = len(models) + len(maps) + len(seqs) == len(types)
    out: list[tuple[str, str, str]] = []
    if isinstance(value, dict) and (models or maps):
        for k, v in value.items():
            if not isinstance(k, str):
                continue  # pydantic names a bad key
            try:
                child = _child_type(models[0] if models else maps[0], k, at)
            except _PathError:
                continue  # an unknown key: pydantic names it with a did-you-mean
            out += _shape_problems(v, child, join_path(at, k))
        return out
    if isinstance(value, list) and seqs:
        for i, v in enumerate(value):
            try:
                child = _child_type(seqs[0], i, at)
            except _PathError:
                continue
            out += _shape_problems(v, child, join_path(at, i))
        return out
    if not only_containers or not types:
        return []  # a scalar may go here; pydantic checks which
    want = " or ".join([w for w, ok in (("a mapping (key: value lines)", models or maps), ("a list", seqs)) if ok])
    return [(at, f"must be {want}; got {_kind(value)}", at)]


def _under(path: str, parents: set[str]) -> bool:
    """Is a YAML path one of `parents` or below one of them?"""
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "[") for p in parents)


# --------------------------------------------------------------------------- overrides

def _apply_override(raw: dict, sources: dict, text: str) -> None:
    """Apply one `a.b[1].c=value` (value parsed as YAML) to the merged recipe, in place."""
    key, eq, value_text = text.partition("=")
    if not eq or not key.strip():
        raise ValueError(f"--set {text}: expected key=value, e.g. stages.pretrain.tokens=500000")
    try:
        tokens = parse_path(key.strip())
        value = yaml.load(value_text, Loader=YamlLoader) if value_text.strip() else None
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
                raise ValueError(f"{join_path(at, token)}: index out of range; {at} has {size} item(s) (--set {text})")
            token = token % len(node)
        elif not isinstance(node, dict):
            raise ValueError(f"{join_path(at, token)}: {at} is not a mapping (--set {text})")
        at = join_path(at, token)
        if last:
            node[token] = value
        else:
            child = node[token] if isinstance(token, int) else node.get(token)
            if child is None:
                node[token] = child = {}
            node = child
    drop_under(sources, at)
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
        path = join_path(path, t)
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        name = str(loc[-1])
        keys = _model_keys(parent) if parent else {}
        return path, f"unknown key{did_you_mean(name, keys)}", path
    why = _friendly(err)
    model = _model_at(loc)
    if err["type"] == "value_error" and model is not None:
        # A model-level check names its field first or in backticks: cite that field.
        words = [why.split(" ")[0], *re.findall(r"`([^`]+)`", why)]
        for w in words:
            if w in _model_keys(model):
                path = join_path(path, w)
                break
    return path, why, path


# --------------------------------------------------------------------------- loading

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
        raise RecipeError([f"recipe file not found: {show_file(str(path))}"])
    raw, sources = load_tree(path, ())
    lines = []  # bad overrides are reported with the validation problems of the rest
    for text in overrides:
        try:
            _apply_override(raw, sources, text)
        except ValueError as e:
            lines.append(str(e))
    # Shape first: a scalar where a mapping or list belongs is reported at its path, and no code
    # below walks the YAML unless every mapping and list is where the schema puts one.
    problems = _shape_problems(raw, Recipe, "")
    shapeless = {p for p, _, _ in problems}
    if not problems:
        _rebase_sources(raw, sources, path)  # override paths (line 0) are never rebased
    workdir = raw.get("workdir")
    if isinstance(workdir, str):
        for var in re.findall(r"\$\{([^}]*)\}", workdir):
            if var not in ("name", "seed"):
                problems.append(("workdir", f"unknown variable ${{{var}}}; only ${{name}} and ${{seed}} are replaced", "workdir"))
    recipe = None
    try:
        recipe = Recipe.model_validate(raw)
        problems += cross_problems(recipe) + engine_problems(recipe)  # the checks that span blocks
    except ValidationError as e:
        problems += [p for p in map(_pydantic_problem, e.errors(include_url=False)) if not _under(p[0], shapeless)]
        seen = {p for p, _, _ in problems}
        if not shapeless:
            problems += [p for p in partial_cross_problems(raw) if p[0] not in seen]
    located = sorted(((locate(where, sources, str(path)), p, why) for p, why, where in problems),
                     key=lambda x: (x[0][1] == 0, x[0]))  # in file order, so they read top to bottom
    lines += [f"{p}: {why} ({cite_location(loc)})" for loc, p, why in located]
    if lines:
        n = len(lines)
        raise RecipeError(lines, f"invalid recipe {show_file(str(path))} ({n} problem{'s' * (n != 1)}):")
    assert recipe is not None
    recipe = recipe.model_copy(update={"workdir": _interpolate(recipe.workdir, recipe)})
    return LoadedRecipe(recipe=recipe, path=path, raw=raw, sources=sources)
