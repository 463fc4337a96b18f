"""`stagewise inspect`: size a model (parameters, active parameters, training memory) without building it.

Sizing answers "will this fit?" before any training starts, from a recipe, a checkpoint
directory or a named preset; resolving which of the three the user meant (`_inspect_target`)
is most of the work, so it sits here with the command rather than in the model library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.options import DebugOpt, JsonOpt, SetOpt, load
from stagewise.cli.output import emit, guarded
from stagewise.recipe.errors import BadInput


def _inspect_target(target: Optional[Path], preset: Optional[str], overrides: list[str]):
    """(ModelConfig, vocab_size, seq_length, micro_batch, precision) for a recipe, checkpoint or preset."""
    from stagewise.model.config import ModelConfig
    from stagewise.model.presets import preset_names

    if preset is not None:
        if target is not None:
            raise BadInput("give a recipe/checkpoint or --preset, not both")
        if preset not in preset_names():
            raise BadInput(f"unknown preset {preset!r}; presets: {', '.join(preset_names())}")
        return ModelConfig(preset=preset), None, 4096, 1, "bf16"
    if target is None:
        raise BadInput("give a recipe (.yaml), a checkpoint directory, --preset NAME or --presets")
    if target.is_dir():
        from stagewise.model.checkpoint_check import check_checkpoint, has_weights

        check_checkpoint(target, weights=has_weights(target))
        return ModelConfig.model_validate({"preset": None, "from": str(target)}), None, 4096, 1, "bf16"
    if target.suffix in (".yaml", ".yml") or target.is_file():
        r = load(target, overrides).recipe
        pre = r.stages.pretrain
        if pre is None:
            return r.model, r.tokenizer.vocab_size, 4096, 1, "bf16"
        prec = "fp32" if pre.precision == "fp32" else "bf16"
        return r.model, r.tokenizer.vocab_size, pre.seq_length, pre.micro_batch, prec
    raise BadInput(f"not found: {target}")


@guarded
def inspect_cmd(
    target: Optional[Path] = typer.Argument(None, help="A recipe (.yaml) or a checkpoint directory (with config.json).", show_default=False),
    preset: Optional[str] = typer.Option(None, "--preset", help="Inspect a named preset instead."),
    presets: bool = typer.Option(False, "--presets", help="List the preset names and exit."),
    seq_length: Optional[int] = typer.Option(None, "--seq-length", min=1, help="Sequence length for the memory estimate (default: the recipe's, else 4096)."),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", min=1, help="Micro-batch for the memory estimate (default: the recipe's, else 1)."),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", min=1, help="Vocabulary size (default: the recipe's tokenizer, else the preset's)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="bf16 or fp32 weights for the memory estimate (default: the recipe's, else bf16)."),
    overrides: list[str] = SetOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Size a model without building it: parameters, active parameters per token, training memory.

    \b
    Example:
      stagewise inspect recipes/nemotron-3-nano-4b.yaml --seq-length 8192 --micro-batch 1
      stagewise inspect --preset nemotron-3-nano-30b-a3b --json
      stagewise inspect runs/tiny/stages/pretrain-*/step-00000360
    """
    if presets:
        from stagewise.model.presets import preset_names

        names = preset_names()
        emit(names, as_json, lambda: typer.echo("\n".join(names)))
        return
    cfg, vocab, seq, micro, prec = _inspect_target(target, preset, overrides)
    prec = precision or prec
    if prec not in ("bf16", "fp32"):
        raise BadInput(f"--precision must be bf16 or fp32, got {prec!r}")
    from stagewise.model.inspect import inspect_model

    report = inspect_model(cfg, vocab_size or vocab, seq_length or seq, micro_batch or micro, precision=prec)

    def text() -> None:
        from rich.console import Console

        Console().print(report.render())

    emit(report, as_json, text)
