"""`stagewise ablate`: bad variants and recipes the doctor rejects exit 2 before anything trains."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from stagewise.cli import app

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
runner = CliRunner()


def _start(tmp_path) -> str:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    return str(tmp_path / "ckpt")


def test_a_typo_in_a_variant_exits_2_naming_it(tmp_path):
    result = runner.invoke(app, ["ablate", str(TINY), "--stage", "sft", "--from", _start(tmp_path), "--variant", "a",
                                 "--variant", "b:stages.sft.stages[0].tokenz=1", "--set", f"workdir={tmp_path}/w"])
    assert result.exit_code == 2 and "--variant b" in result.output and "tokenz" in result.output
    assert not (tmp_path / "w").exists()  # nothing ran


def test_the_doctor_judges_each_variant(tmp_path):
    hot = "hot:stages.sft.stages[0].optimizer.lr=0.01"  # above the recipe's pretraining peak (3e-3)
    args = ["ablate", str(TINY), "--stage", "sft", "--from", _start(tmp_path), "--variant", "a", "--variant", hot,
            "--set", f"workdir={tmp_path}/w"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "variant hot: the recipe doctor found" in result.output and "stages.sft.stages[0].optimizer.lr" in result.output
    assert not (tmp_path / "w").exists()


def test_help_teaches_with_an_example():
    result = runner.invoke(app, ["ablate", "--help"])
    assert result.exit_code == 0
    assert "--variant" in result.output and "no_format:stages.sft.stages[0].blend.weights.format=0" in result.output
