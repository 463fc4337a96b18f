"""A small RL world for the benchmark tests (benchmarks/ scripts load through scripts.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def rl_rows(tmp_path_factory):
    """The demo world's RL rows, small: rl_<domain>.jsonl and rl_eval.jsonl."""
    from stagewise.data.world.rl_prompts import generate_rl_world

    out = tmp_path_factory.mktemp("rl_rows")
    generate_rl_world(out, seed=3, per_domain=24, eval_fraction=0.3, n_entities=40)
    return out
