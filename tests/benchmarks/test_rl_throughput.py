"""The RL throughput benchmark runs its three modes on a tiny random checkpoint and reports their ratios."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.scripts import load_benchmark

SMALL = ["--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "4",
         "--heldout", "4", "--heldout-samples", "2", "--threads", "1", "--device", "cpu"]


def test_all_modes_run_the_same_steps_and_the_table_shows_their_ratios(tiny_checkpoint, rl_rows, capsys, monkeypatch):
    bench = load_benchmark("rl_throughput")
    assert bench.main(["--checkpoint", str(tiny_checkpoint), "--rows", str(rl_rows), *SMALL, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    sync, off, proc = (result["modes"][m] for m in ("sync", "off-policy", "off-policy-process"))
    for m in (sync, off, proc):
        assert m["steps"] == 2 and m["wall_s"] > 0 and m["generated_tokens"] > 0 and m["trained_tokens"] > 0
        assert m["tokens_per_s"] == pytest.approx((m["generated_tokens"] + m["trained_tokens"]) / m["wall_s"])
        assert 0 <= m["train_accuracy_last"] <= 1 and set(m["heldout"]) == {"greedy", "pass_at_1"}
    assert result["ratio_tokens_per_s"] == pytest.approx(off["tokens_per_s"] / sync["tokens_per_s"])
    assert result["ratio_tokens_per_s_process"] == pytest.approx(proc["tokens_per_s"] / sync["tokens_per_s"])
    # the worker samples with the in-process generator's numerics (both 1 thread): the same rollouts
    # (the same 2 steps and held-out answers: the first batch comes from the same starting weights)
    assert proc["heldout"] == off["heldout"] and proc["generated_tokens"] == off["generated_tokens"]
    assert 0 < result["heldout_prompts"] <= 4 and set(result["start"]["heldout"]) == {"greedy", "pass_at_1"}

    bench.print_table(result)
    table = capsys.readouterr().out
    assert all(row in table for row in ("│ start ", "│ sync ", "│ off-policy ", "│ off-policy, process "))
    assert f"off-policy / sync: tokens/s {result['ratio_tokens_per_s']:.2f}x" in table
    assert f"off-policy, process / sync: tokens/s {result['ratio_tokens_per_s_process']:.2f}x" in table


def test_missing_inputs_exit_2_saying_what_to_do(tiny_checkpoint, rl_rows, tmp_path, capsys, monkeypatch):
    bench = load_benchmark("rl_throughput")
    monkeypatch.setattr(bench, "newest", lambda *a, **k: None)
    assert bench.main(["--rows", str(rl_rows)]) == 2
    assert "stagewise demo" in capsys.readouterr().err
    assert bench.main(["--checkpoint", str(tiny_checkpoint), "--rows", str(tmp_path)]) == 2
    assert f"--rows {tmp_path}: missing rl_arithmetic.jsonl, rl_format.jsonl, rl_eval.jsonl" in capsys.readouterr().err
    assert bench.main(["--checkpoint", str(tmp_path), "--rows", str(rl_rows)]) == 2
    assert "not a checkpoint" in capsys.readouterr().err
