"""The rollout benchmark samples the same prompts both ways and reports their ratio."""

from __future__ import annotations

import json

import pytest
import torch

from tests.benchmarks.scripts import load_benchmark


def test_both_samplers_draw_every_row_and_the_ratio_is_theirs(capsys):
    bench = load_benchmark("rollouts")
    assert bench.main(["--prompts", "6", "--samples", "3", "--max-new-tokens", "4", "--repeat", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("ours", "transformers"):
        r = out[name]
        # 18 rows of 1-4 sampled tokens (a row may end early at the end token)
        assert 18 <= r["sampled_tokens"] <= 18 * 4 and r["seconds"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["sampled_tokens"] / r["seconds"])
    assert out["speed_ratio_ours_over_transformers"] == pytest.approx(
        out["ours"]["tokens_per_s"] / out["transformers"]["tokens_per_s"])
    bench.main(["--prompts", "2", "--samples", "2", "--max-new-tokens", "2", "--repeat", "1"])
    assert "ours / transformers = " in capsys.readouterr().out


def test_the_stock_path_counts_each_row_up_to_its_first_end():
    bench = load_benchmark("rollouts")
    end = bench.END
    new = torch.tensor([[5, end, 0, 0], [5, 6, 7, 8], [end, 0, end, 0]])
    assert bench.tokens_until_end(new) == 2 + 4 + 1
