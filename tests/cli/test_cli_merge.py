"""`stagewise merge`: merges in token order, reports JSON, exits 2 naming a mismatch."""

from __future__ import annotations

import json
from dataclasses import asdict

import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from stagewise.cli import app
from stagewise.model.checkpoint import CheckpointMeta, weights_sha256

runner = CliRunner()


def _ckpt(root, value: float, tokens: int, hidden: int = 4):
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": hidden}))
    save_file({"w": torch.full((2, hidden), value)}, root / "model.safetensors", metadata={"format": "pt"})
    meta = CheckpointMeta("pretrain", tokens, tokens, "rh", None, weights_sha256(root))
    (root / "stagewise.json").write_text(json.dumps(asdict(meta)))
    return root


def test_merge_orders_by_tokens_and_reports_json(tmp_path):
    new, old = _ckpt(tmp_path / "new", 4.0, 200), _ckpt(tmp_path / "old", 0.0, 100)
    result = runner.invoke(app, ["merge", str(new), str(old), "--schedule", "uniform", "--out", str(tmp_path / "m"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [i["tokens_seen"] for i in report["inputs"]] == [100, 200] and report["tokens_seen"] == 200
    assert torch.equal(load_file(tmp_path / "m" / "model.safetensors")["w"], torch.full((2, 4), 2.0))


def test_minus_sqrt_weights_the_oldest_most(tmp_path):
    a, b = _ckpt(tmp_path / "a", 0.0, 1), _ckpt(tmp_path / "b", 1.0, 2)
    assert runner.invoke(app, ["merge", str(a), str(b), "--out", str(tmp_path / "m")]).exit_code == 0
    merged = load_file(tmp_path / "m" / "model.safetensors")["w"]
    assert torch.allclose(merged, torch.full((2, 4), 1 - 0.5**0.5))  # c = [sqrt(.5), 1 - sqrt(.5)]


def test_mismatched_checkpoints_exit_2_naming_the_mismatch(tmp_path):
    a, b = _ckpt(tmp_path / "a", 0.0, 1), _ckpt(tmp_path / "b", 1.0, 2, hidden=8)
    result = runner.invoke(app, ["merge", str(a), str(b), "--out", str(tmp_path / "m"), "--json"])
    assert result.exit_code == 2
    assert "hidden_size" in json.loads(result.stdout)["error"]
    assert not (tmp_path / "m").exists()


def test_bad_schedule_and_missing_dir_exit_2(tmp_path):
    a, b = _ckpt(tmp_path / "a", 0.0, 1), _ckpt(tmp_path / "b", 1.0, 2)
    result = runner.invoke(app, ["merge", str(a), str(b), "--schedule", "sqrt", "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "minus-sqrt" in result.output
    result = runner.invoke(app, ["merge", str(a), str(tmp_path / "nope"), "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "nope" in result.output
