"""The RL-vs-TRL benchmark trains both for a (tiny) wall-clock budget from one checkpoint and reports
their held-out gains per minute and the ratio (dev-only: it needs `trl`)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.scripts import load_benchmark

pytest.importorskip("trl")

SMALL = ["--budget-s", "0.5", "--heldout-samples", "2", "--threads", "1", "--device", "cpu",
         "--set", "stages.rl.prompts_per_step=2", "--set", "stages.rl.rollout.max_new_tokens=4"]


def test_both_trainers_train_for_the_budget_and_the_ratio_is_theirs(tiny_checkpoint, rl_rows, capsys):
    bench = load_benchmark("rl_vs_trl")
    assert bench.main(["--checkpoint", str(tiny_checkpoint), "--rows", str(rl_rows), *SMALL, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["group_size"] == 4 and r["prompts_per_step"] == 2 and r["minibatches"] == 2  # the recipe's, overridden
    assert 0 < r["test_prompts"] and set(r["before"]) == {"arithmetic", "format", "all"}
    for name in ("ours", "trl"):
        t = r["trainers"][name]
        assert t["steps"] >= 1 and t["wall_s"] >= 0.5 and t["tokens_per_s"] > 0, name
        assert t["gain"] == pytest.approx(t["after"]["all"] - r["before"]["all"])
        assert t["gain_per_minute"] == pytest.approx(t["gain"] / (t["wall_s"] / 60))
    ours, trl = r["trainers"]["ours"], r["trainers"]["trl"]
    if trl["gain_per_minute"] > 0:
        assert r["gain_per_minute_ratio"] == pytest.approx(ours["gain_per_minute"] / trl["gain_per_minute"])
    else:
        assert r["gain_per_minute_ratio"] is None

    bench.print_table(r)
    table = capsys.readouterr().out
    assert "│ ours " in table and "│ trl " in table
    assert ("gain per minute, ours / TRL" in table) == (r["gain_per_minute_ratio"] is not None)


def test_missing_inputs_exit_2(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    bench = load_benchmark("rl_vs_trl")
    monkeypatch.setattr(bench, "newest", lambda *a, **k: None)
    monkeypatch.setattr(bench, "default_rows", lambda *a, **k: None)
    assert bench.main([]) == 2
    assert "stagewise demo" in capsys.readouterr().err
    assert bench.main(["--checkpoint", str(tiny_checkpoint)]) == 2
    assert "RL rows" in capsys.readouterr().err
