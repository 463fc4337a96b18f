"""The learning benchmark runs the recipe's stages before SFT once, then SFT -> RL per seed, and
reports each seed's RL test gain with its interval and the mean (a toy-sized recipe: a few steps
of every stage, so the figures are noise; what is checked is where they come from)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.scripts import load_benchmark
from tests.short_pipeline import SHORT


@pytest.mark.slow
def test_base_once_then_sft_and_rl_per_seed(tmp_path, capsys):
    bench = load_benchmark("learning")
    argv = ["--recipe", "recipes/tiny.yaml", "--seeds", "2", "--first-seed", "5", "--workdir", str(tmp_path),
            *[a for v in SHORT for a in ("--set", v)], "--json"]
    assert bench.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["seed"] for r in result["seeds"]] == [5, 6]
    base = (tmp_path / "base").resolve()
    assert result["base_checkpoint"].startswith(str(base / "stages" / "long_context-"))  # what SFT starts from in the demo
    for r in result["seeds"]:
        finished = next((tmp_path / f"seed-{r['seed']}" / "stages").glob("rl-*/finished.json"))
        rl = json.loads(finished.read_text())["result"]
        assert rl["summary"]["before"] == r["before"] and rl["summary"]["after"] == r["after"]
        assert r["gain"] == pytest.approx(r["after"] - r["before"])
        assert (r["low"], r["high"]) == (rl["summary"]["gain_low"], rl["summary"]["gain_high"])
        assert r["low"] <= r["high"] and r["dev_after"] == rl["metrics"]["rl/dev/pass_at_1/all"]
        sft = json.loads(next((tmp_path / f"seed-{r['seed']}" / "stages").glob("sft-" + "?" * 16 + "/finished.json")).read_text())
        assert sft["result"]["parent"] == result["base_checkpoint"]  # every seed starts from the one base
    worlds = [next((tmp_path / f"seed-{seed}" / "rl_world").glob("*/rl_eval.jsonl")).read_text() for seed in (5, 6)]
    assert worlds[0] != worlds[1]  # the seed reached the run: its own task rows and held-out split
    assert result["mean_gain"] == pytest.approx(sum(r["gain"] for r in result["seeds"]) / 2)
    assert result["intervals_above_zero"] == sum(r["low"] > 0 for r in result["seeds"])

    bench.print_table(result)
    out = capsys.readouterr().out
    assert "RL test pass@1 over seeds" in out and "intervals above zero" in out


def test_a_missing_checkpoint_exits_2(tmp_path, capsys):
    bench = load_benchmark("learning")
    assert bench.main(["--checkpoint", str(tmp_path / "nowhere"), "--workdir", str(tmp_path)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_a_failed_run_names_its_command(tmp_path, capsys):
    bench = load_benchmark("learning")
    assert bench.main(["--checkpoint", str(tmp_path), "--workdir", str(tmp_path), "--seeds", "1",
                       "--set", "stages.rl.steps=-1"]) == 1
    err = capsys.readouterr().err
    assert "exit 2" in err and "stages.rl.steps" in err and "--stages sft,rl" in err
