"""Fuzzing the shipped recipes: every path mutated, the file itself corrupted, `--set` garbage.

Mutations: a value replaced by another type (string, list, mapping, number, boolean, null),
a key deleted, a number pushed out of range (0, negative, huge, fractional, nan); the file
truncated, sprinkled with random bytes, re-encoded as Latin-1 / UTF-16, or a line replaced by
noise; `--set KEY=VALUE` with mangled keys and values. Each case goes through
`stagewise recipe show` (or `stagewise inspect RECIPE`), the validation-only paths, so nothing
trains. Seeds are fixed (derandomize) so CI sees the same cases; a case found failing while
this suite was built is kept as an @example.
"""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SHIPPED = sorted(p.name for p in RECIPES.glob("*.yaml"))
SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate, Phase.shrink])  # no coverage-traced "explain" phase


def _paths(node: Any, at: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += [(*at, k), *_paths(v, (*at, k))]
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += [(*at, i), *_paths(v, (*at, i))]
    return out


TREES = {name: yaml.safe_load((RECIPES / name).read_text()) for name in SHIPPED}
PATHS = sorted({(name, p) for name in SHIPPED for p in _paths(TREES[name])}, key=repr)

SUBSTITUTES = st.one_of(
    st.sampled_from(["a-string", "", [1, "x"], [], {"k": 1}, {}, 7, -3, 0, 2.5, True, None, "@world/none.jsonl",
                     "../../etc/passwd", "${nope}", "x" * 300]),
    st.text(max_size=12), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
OUT_OF_RANGE = st.sampled_from([0, -1, -0.5, 1.5, 10**12, 2**63, 1e-12, 1e30, float("nan"), float("inf")])


def _mutate(tree: dict, path: tuple, op: str, value: Any) -> dict:
    tree = copy.deepcopy(tree)
    node = tree
    for t in path[:-1]:
        node = node[t]
    key = path[-1]
    if op == "delete":
        del node[key]
    elif op == "range":
        if isinstance(node[key], (int, float)) and not isinstance(node[key], bool):
            node[key] = value
        else:
            node[key] = None
    else:
        node[key] = value
    return tree


def _write(tmp: Path, name: str, tree: dict) -> Path:
    for other in SHIPPED:  # a `base:` names a sibling
        if other != name:
            shutil.copy(RECIPES / other, tmp / other)
    path = tmp / name
    path.write_text(yaml.safe_dump(tree, sort_keys=False, allow_unicode=True))
    return path


def test_recipe_mutations_exit_0_or_2(tmp_path, cli):
    run, check, cases = cli

    # Cases that crashed (exit 1) before the loader checked shape first: kept as regressions.
    @example(("tiny.yaml", ("data",)), "swap", "a-string")
    @example(("tiny.yaml", ("data",)), "swap", [1, "x"])
    @example(("tiny.yaml", ("stages",)), "swap", 7)
    @example(("tiny.yaml", ("stages", "pretrain", "phases")), "swap", 7)
    @example(("tiny.yaml", ("model", "preset")), "swap", None)
    @example(("tiny.yaml", ("data", "sources", 0)), "swap", {"name[": 1})
    @settings(max_examples=550, **SETTINGS)
    @given(st.sampled_from(PATHS), st.sampled_from(["swap", "delete", "range"]), st.one_of(SUBSTITUTES, OUT_OF_RANGE))
    def case(where, op, value):
        name, path = where
        f = _write(tmp_path, name, _mutate(TREES[name], path, op, value))
        cases["recipe mutations"] += 1
        check(run(["recipe", "show", str(f)]))

    case()
    assert cases["recipe mutations"] >= 550


def test_recipe_mutations_through_inspect(tmp_path, cli):
    run, check, cases = cli

    @settings(max_examples=60, **SETTINGS)
    @given(st.sampled_from([p for p in PATHS if p[1][0] in ("model", "tokenizer", "stages")]),
           st.sampled_from(["swap", "delete", "range"]), st.one_of(SUBSTITUTES, OUT_OF_RANGE))
    def case(where, op, value):
        name, path = where
        f = _write(tmp_path, name, _mutate(TREES[name], path, op, value))
        cases["inspect recipe"] += 1
        check(run(["inspect", str(f), "--json"]))

    case()
    assert cases["inspect recipe"] >= 60


def _corrupt(data: bytes, how: str, at: float, noise: bytes) -> bytes:
    cut = int(len(data) * at)
    if how == "truncate":
        return data[:cut]
    if how == "bytes":
        return data[:cut] + noise + data[cut:]
    if how == "latin1":
        return data.decode("utf-8").replace("#", "# é ½ ").encode("latin-1", errors="replace")
    if how == "utf16":
        return data.decode("utf-8").encode("utf-16")
    lines = data.split(b"\n")
    lines[int(at * (len(lines) - 1))] = noise
    return b"\n".join(lines)


def test_corrupted_recipe_files(tmp_path, cli):
    run, check, cases = cli

    @example("tiny.yaml", "bytes", 0.5, b"\xff\xfe\x00")
    @example("tiny.yaml", "utf16", 0.0, b"")
    @settings(max_examples=150, **SETTINGS)
    @given(st.sampled_from(SHIPPED), st.sampled_from(["truncate", "bytes", "latin1", "utf16", "line"]),
           st.floats(0, 1), st.binary(min_size=1, max_size=24))
    def case(name, how, at, noise):
        for other in SHIPPED:
            shutil.copy(RECIPES / other, tmp_path / other)
        f = tmp_path / name
        f.write_bytes(_corrupt((RECIPES / name).read_bytes(), how, at, noise))
        cases["recipe files"] += 1
        check(run(["recipe", "show", str(f)]))

    case()
    assert cases["recipe files"] >= 150


def test_base_cycle_and_missing_base_exit_2(tmp_path, cli):
    run, check, cases = cli
    (tmp_path / "a.yaml").write_text("base: b.yaml\nname: a\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nname: b\n")
    (tmp_path / "c.yaml").write_text("base: [x]\nname: c\n")
    (tmp_path / "d.yaml").write_text("base: missing.yaml\nname: d\n")
    for name, why in (("a", "inheritance cycle"), ("c", "base: must be a file name"), ("d", "file not found")):
        o = run(["recipe", "show", str(tmp_path / f"{name}.yaml")])
        check(o)
        assert o.code == 2 and why in o.err, o.describe()


def test_set_overrides(cli):
    run, check, cases = cli
    keys = [".".join(str(t) if isinstance(t, str) else f"[{t}]" for t in p).replace(".[", "[")
            for n, p in PATHS if n == "tiny.yaml"]

    @example("stages.pretrain.phases[9].until", "1")
    @example("data", "[1, 2")
    @settings(max_examples=150, **SETTINGS)
    @given(st.one_of(st.sampled_from(keys), st.text(max_size=16)),
           st.one_of(st.sampled_from(["null", "[]", "{}", "-1", "1e40", "[1", "a: b", "'x"]), st.text(max_size=16)))
    def case(key, value):
        cases["--set"] += 1
        check(run(["recipe", "show", str(RECIPES / "tiny.yaml"), "--set", f"{key}={value}"]))

    case()
    assert cases["--set"] >= 150


def test_the_shipped_recipes_still_load(cli):
    run, check, cases = cli
    for name in SHIPPED:
        o = run(["recipe", "show", str(RECIPES / name)])
        assert o.code == 0, o.describe()
    assert not math.isnan(len(PATHS)) and len(PATHS) > 100
