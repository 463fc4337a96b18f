"""Recipe files as YAML: reading with the line of every value, and `base:` inheritance.

load_tree() turns a recipe file into the merged plain data of its `base:` chain (mappings
merge key by key, lists and scalars are replaced whole) plus, for every YAML path, the file
and line that defined it, so a problem found later can cite `<file>:<line>`. Nothing here
knows the schema; recipe/loader.py applies overrides and validates the result.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import yaml

from stagewise.data.errors import read_utf8
from stagewise.recipe.errors import RecipeError, join_path, show_file


class YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-3` as a float (YAML 1.1 insists on a dot)."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _read_yaml(path: Path) -> tuple[dict, dict[str, tuple[str, int]]]:
    """One YAML mapping and the line of every key / sequence item in it."""
    text = read_utf8(show_file(str(path)), "recipe")
    loader = None
    try:
        loader = YamlLoader(text)  # rejects unprintable characters already
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else {}
    except yaml.YAMLError as e:
        raise RecipeError([f"{_yaml_where(e, text, path)}: invalid YAML: {getattr(e, 'problem', None) or e}"]) from None
    except RecursionError:
        raise RecipeError([f"{show_file(str(path))}: invalid YAML: nested too deeply"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise RecipeError([f"{show_file(str(path))}: a recipe must be a YAML mapping (key: value lines)"])
    lines: dict[str, tuple[str, int]] = {}
    dups: list[str] = []
    try:
        _walk_lines(node, "", str(path), lines, dups)
    except RecursionError:  # an alias that contains itself (`a: &x [*x]`)
        raise RecipeError([f"{show_file(str(path))}: invalid YAML: a value contains itself (recursive alias)"]) from None
    if dups:
        raise RecipeError(dups, f"invalid recipe {show_file(str(path))}:")
    return data, lines


def _yaml_where(e: yaml.YAMLError, text: str, path: Path) -> str:
    """`file:line` of a YAML error (a reader error knows a character position, others a mark)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is not None:
        return f"{show_file(str(path))}:{mark.line + 1}"
    position = getattr(e, "position", None)
    if isinstance(position, int):
        return f"{show_file(str(path))}:{text.count(chr(10), 0, position) + 1}"
    return show_file(str(path))


def _walk_lines(node, path: str, file: str, out: dict, dups: list[str]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k, v in node.value:
            key = join_path(path, str(k.value))
            if key in seen:
                dups.append(f"{key}: duplicate key ({show_file(file)}:{k.start_mark.line + 1})")
            seen.add(key)
            out[key] = (file, k.start_mark.line + 1)
            _walk_lines(v, key, file, out, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            key = join_path(path, i)
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
            yield from _replaced_paths(v, join_path(path, str(k)))
    elif path:
        yield path


def drop_under(sources: dict, path: str) -> None:
    """Forget the origins recorded below a YAML path (its value was replaced whole)."""
    for k in [k for k in sources if k.startswith(path + ".") or k.startswith(path + "[")]:
        del sources[k]


def load_tree(path: Path, chain: tuple[Path, ...]) -> tuple[dict, dict[str, tuple[str, int]]]:
    """A recipe file merged over its `base:` chain, with the origin of every value."""
    if path in chain:
        cycle = " -> ".join(show_file(str(p)) for p in (*chain[chain.index(path):], path))
        raise RecipeError([f"base: inheritance cycle: {cycle}"])
    data, lines = _read_yaml(path)
    base = data.pop("base", None)
    base_line = lines.pop("base", (str(path), 0))
    if base is None:
        return data, lines
    where = f"{show_file(str(path))}:{base_line[1]}"
    if not isinstance(base, str):
        raise RecipeError([f"base: must be a file name relative to this recipe ({where})"])
    try:
        base_path = (path.parent / base).resolve()
    except (OSError, ValueError) as e:  # a NUL byte, a symlink loop
        raise RecipeError([f"base: not a usable file name: {e} ({where})"]) from None
    if not base_path.is_file():
        raise RecipeError([f"base: file not found: {show_file(str(base_path))} ({where})"])
    base_data, sources = load_tree(base_path, (*chain, path))
    for p in _replaced_paths(data):
        drop_under(sources, p)
    sources.update(lines)
    return _deep_merge(base_data, data), sources
