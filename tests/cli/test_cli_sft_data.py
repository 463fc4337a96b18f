"""`stagewise data curate` and `stagewise data pack`: JSON reports, files written, exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from stagewise.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from stagewise.data.world.conversations import generate_sft_world

    return generate_sft_world(tmp_path_factory.mktemp("world"), seed=0, per_domain=30, long_context=2, n_entities=100)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, world):
    """A small BPE without a chat template (the pack command must add it)."""
    from stagewise.data.tokenizer import train_bpe

    tok = train_bpe(world["arithmetic"].read_text().splitlines() + world["calculator"].read_text().splitlines(), 500)
    out = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(out)
    return out


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_curate_json(world, tmp_path):
    result = run("data", "curate", world["dirty"], "--out", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["kept"] == 80
    assert report["rejected"] == {"empty_assistant": 1, "exact_duplicate": 3, "malformed_json": 2, "near_duplicate": 3,
                                  "repetition_window": 1, "role_order": 3, "tool_call_without_tools": 1,
                                  "undefined_tool": 1, "unknown_role": 1}
    assert len((tmp_path / "sft_dirty.jsonl").read_text().splitlines()) == 80
    assert len((tmp_path / "sft_dirty.rejects.jsonl").read_text().splitlines()) == 16
    assert json.loads((tmp_path / "sft_dirty.report.json").read_text())["kept"] == 80


def test_curate_reject_rate_and_bad_config_exit_2(world, tmp_path):
    result = run("data", "curate", world["dirty"], "--out", tmp_path, "--max-reject-rate", "0.1")
    assert result.exit_code == 2 and "above max_reject_rate" in result.output and "sft_dirty" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("jaccard_treshold: 0.7\n")
    result = run("data", "curate", world["dirty"], "--out", tmp_path, "--config", bad, "--json")
    assert result.exit_code == 2 and "jaccard_treshold" in json.loads(result.stdout)["error"]
    assert run("data", "curate", tmp_path / "missing.jsonl", "--out", tmp_path).exit_code == 2


def test_curate_config_is_applied(world, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("near_dedup: false\nexact_dedup: false\n")
    result = run("data", "curate", world["dirty"], "--out", tmp_path, "--config", cfg, "--json")
    rejected = json.loads(result.stdout)["rejected"]
    assert "near_duplicate" not in rejected and "exact_duplicate" not in rejected


def test_pack_json(world, tokenizer_dir, tmp_path):
    out = tmp_path / "packs.npz"
    result = run("data", "pack", world["arithmetic"], "--tokenizer", tokenizer_dir, "--pack-size", 512,
                 "--out", out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {"packs", "efficiency", "dropped", "supervised_tokens"} <= set(report)
    assert report["packs"] > 0 and 0.5 < report["efficiency"] <= 1 and report["dropped"] == 0
    assert report["supervised_tokens"] > 0 and out.is_file()
    tiny = run("data", "pack", world["arithmetic"], "--tokenizer", tokenizer_dir, "--pack-size", 8, "--json")
    tiny_report = json.loads(tiny.stdout)  # every conversation is longer than a pack: dropped, never split
    assert tiny_report["conversations"] == 0 and tiny_report["dropped"] == report["conversations"]


def test_pack_bad_input_exit_2(world, tokenizer_dir, tmp_path):
    result = run("data", "pack", world["dirty"], "--tokenizer", tokenizer_dir, "--pack-size", 512)
    assert result.exit_code == 2 and "curate it first" in result.output
    assert run("data", "pack", world["arithmetic"], "--tokenizer", tmp_path, "--pack-size", 512).exit_code == 2
    assert run("data", "pack", world["arithmetic"], "--tokenizer", tokenizer_dir, "--pack-size", 0).exit_code == 2


def test_pack_takes_the_recipes_reasoning_switch(world, tokenizer_dir):
    """--reasoning-switch is tokenizer.reasoning_switch (YAML): ours reads `reasoning`, so auto packs half the
    conversations off; named `{kind: none}` the same request is refused naming the recipe field, as SFT does."""
    pack = ("data", "pack", world["arithmetic"], "--tokenizer", tokenizer_dir, "--pack-size", 512, "--json")
    auto = run(*pack, "--reasoning-off-fraction", 0.5)
    assert auto.exit_code == 0 and json.loads(auto.stdout)["reasoning_off"] > 0, auto.output
    refused = run(*pack, "--reasoning-off-fraction", 0.5, "--reasoning-switch", "{kind: none}")
    assert refused.exit_code == 2 and "tokenizer.reasoning_switch: the chat template of the tokenizer" in refused.output
    on = run(*pack, "--reasoning-switch", "{kind: none}")  # nothing asked off: no switch needed
    assert on.exit_code == 0, on.output
    assert json.loads(on.stdout)["supervised_tokens"] == json.loads(run(*pack).stdout)["supervised_tokens"]
    for bad, why in (("{kind: sys}", "does not match any of the expected tags"),
                     ("{kind: kwarg}", "kwarg.name: Field required"), ("[", "not YAML")):
        result = run(*pack, "--reasoning-switch", bad)
        assert result.exit_code == 2 and "--reasoning-switch: " in result.output and why in result.output, result.output
