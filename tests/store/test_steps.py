"""Content-addressed steps: what enters a step's hash, the finish marker, and how reuse shows in Prefect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from stagewise.data.content_hash import canonical, step_hash
from stagewise.store.steps import MARKER, finished, mark_finished, step_dir


class Spec(BaseModel):
    lr: float
    out_dir: str = "/somewhere"


def test_the_hash_follows_spec_kind_and_inputs_not_output_locations():
    base = step_hash("pretrain", {"train": Spec(lr=1e-3), "seed": 1}, ["data-a"])
    assert base == step_hash("pretrain", {"train": Spec(lr=1e-3, out_dir="/elsewhere"), "seed": 1, "workdir": "/w"},
                             ["data-a"])
    assert base != step_hash("pretrain", {"train": Spec(lr=2e-3), "seed": 1}, ["data-a"])
    assert base != step_hash("pretrain", {"train": Spec(lr=1e-3), "seed": 2}, ["data-a"])
    assert base != step_hash("pretrain", {"train": Spec(lr=1e-3), "seed": 1}, ["data-b"])
    assert base != step_hash("sft", {"train": Spec(lr=1e-3), "seed": 1}, ["data-a"])
    assert len(base) == 16 and int(base, 16) >= 0


def test_key_order_does_not_matter_and_unknown_types_are_refused():
    assert step_hash("k", {"a": 1, "b": [1, 2]}) == step_hash("k", {"b": [1, 2], "a": 1})
    assert canonical({"p": Path("/x"), "t": (1, 2)}) == {"p": "/x", "t": [1, 2]}
    with pytest.raises(TypeError, match="cannot hash a object"):
        canonical({"x": object()})


def test_step_dir_is_kind_dash_hash(tmp_path):
    d = step_dir(tmp_path, "merge", {"w": [1]}, ["abc"])
    assert d.parent == tmp_path and d.name == f"merge-{step_hash('merge', {'w': [1]}, ['abc'])}"


def test_the_marker_is_written_atomically_and_read_back(tmp_path):
    out = tmp_path / "pretrain-x"
    assert finished(out) is None
    mark_finished(out, {"result": {"checkpoint": "/c"}, "at": [3, 12]})
    assert finished(out) == {"result": {"checkpoint": "/c"}, "at": [3, 12]}
    assert [p.name for p in out.iterdir()] == [MARKER]  # no temp file left behind
    assert json.loads((out / MARKER).read_text())["at"] == [3, 12]
