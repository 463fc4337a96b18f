"""Hostile recipes are refused with the YAML path and line, never a crash (issue: bad input exits 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.data.errors import BadInput
from stagewise.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def _recipe(tmp_path: Path, replace: tuple[str, str] | None = None, raw: bytes | None = None) -> Path:
    text = TINY.read_text()
    if replace:
        assert replace[0] in text
        text = text.replace(replace[0], replace[1], 1)
    f = tmp_path / "r.yaml"
    f.write_bytes(raw if raw is not None else text.encode())
    return f


@pytest.mark.parametrize("old,new,where,why", [
    ("data:\n", "data: a-string\nold_data:\n", "data", "must be a mapping (key: value lines); got a string 'a-string'"),
    ("stages:\n", "stages: 7\nold_stages:\n", "stages", "must be a mapping"),
    ("    phases:\n", "    phases: 7\n    old_phases:\n", "stages.pretrain.phases", "must be a list; got a number 7"),
    ("  preset: tiny", "  preset: null", "model.preset", "required: a preset name"),
])
def test_a_wrong_shape_is_named_at_its_path_and_line(tmp_path, old, new, where, why):
    f = _recipe(tmp_path, (old, new))
    with pytest.raises(RecipeError) as e:
        load_recipe(f)
    key = where.split(".")[-1]
    line = next(i for i, text in enumerate(f.read_text().splitlines(), 1) if text.strip().startswith(f"{key}:"))
    assert f"{where}: {why}" in str(e.value) and f"r.yaml:{line})" in str(e.value), str(e.value)


def test_non_utf8_and_yaml_errors_cite_the_line(tmp_path):
    f = _recipe(tmp_path, raw=b"name: x\nseed: 1\nworkdir: caf\xe9\n")
    with pytest.raises(BadInput, match=r"r.yaml:3: not UTF-8"):
        load_recipe(f)
    f = _recipe(tmp_path, raw=b"name: x\nseed: [1\nworkdir: y\n")
    with pytest.raises(BadInput, match=r"r.yaml:\d: invalid YAML"):
        load_recipe(f)
    f = _recipe(tmp_path, raw=b"name: x\x00\n")
    with pytest.raises(BadInput, match=r"r.yaml:1: invalid YAML"):
        load_recipe(f)


def test_a_key_that_looks_like_a_path_is_still_reported(tmp_path):
    f = _recipe(tmp_path, ("model:\n", "model:\n  \"we[ird\": 1\n"))
    with pytest.raises(RecipeError, match=r"model.we\[ird: unknown key"):
        load_recipe(f)


def test_recipe_error_is_the_one_bad_input_type():
    assert RecipeError is BadInput and issubclass(BadInput, ValueError)
