"""`stagewise quantize`: AutoQuantize one checkpoint to NVFP4 / FP8 / BF16 per operator and export it.

The quantize stage's work on a checkpoint already on disk, outside a pipeline run: the flags
become the same typed block (recipe/blocks/quantize.py) the recipe's `stages.quantize` is, and the
same task (tasks/quantize.py) plans, quantizes, exports and scores. A recipe (default: the shipped
tiny demo) says where the validation text and the held-out conversations come from.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.options import DebugOpt, JsonOpt, SetOpt, load
from stagewise.cli.output import emit, guarded
from stagewise.recipe.errors import BadInput

FLAG_OF = {"formats": "--formats", "effective_bits": "--effective-bits", "flop_fraction": "--flop-fraction",
           "preset": "--preset", "keep_bf16": "--keep-bf16", "pins": "--pin", "calib_batches": "--calib-batches",
           "score_batches": "--score-batches", "heldout_limit": "--heldout-limit"}


def _block(values: dict):
    """The flags as a QuantizeStage, a pydantic error reported under the flag's name."""
    from pydantic import ValidationError

    from stagewise.recipe.blocks.quantize import QuantizeStage

    try:
        return QuantizeStage(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as e:
        raise BadInput([f"{FLAG_OF.get(str(err['loc'][0]), err['loc'][0])}: {err['msg']}" for err in e.errors()]) from None


def _pins(pins: list[str]) -> list[dict]:
    out = []
    for p in pins:
        pattern, sep, fmt = p.rpartition("=")
        if not sep or not pattern:
            raise BadInput(f"--pin: expected PATTERN=FORMAT (e.g. '*.mixer.experts=nvfp4'), got {p!r}")
        out.append({"pattern": pattern, "format": fmt})
    return out


@guarded
def quantize_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory to quantize (HF format, e.g. a stage's last step).", show_default=False),
    out: Path = typer.Option(..., "--out", help="Export directory (a deployable HF checkpoint; written atomically, replaced if it exists)."),
    formats: str = typer.Option("nvfp4,fp8", "--formats", help="Formats the search may choose per operator besides BF16: nvfp4, fp8."),
    effective_bits: float = typer.Option(6.0, "--effective-bits", help="Budget: average storage bits per searched weight (NVFP4 counts 4.5 with its block scales, FP8 8, BF16 16)."),
    flop_fraction: Optional[float] = typer.Option(None, "--flop-fraction", help="Budget in compute instead: at most this share of the all-BF16 cost (FP8 costs 1/2, NVFP4 1/4 per FLOP); replaces --effective-bits."),
    preset: str = typer.Option("super", "--preset", help="super: search by measured sensitivity under the budget; ultra: the Ultra report's fixed formats (routed experts NVFP4, shared experts and Mamba FP8, the rest BF16)."),
    keep_bf16: Optional[str] = typer.Option(None, "--keep-bf16", help="Comma-separated module patterns kept BF16 (default: lm_head and attention q/k/v)."),
    pin: list[str] = typer.Option([], "--pin", metavar="PATTERN=FORMAT", help="Fix matching operators to a format, e.g. --pin '*.mixer.experts=nvfp4' (repeatable)."),
    calib: Optional[Path] = typer.Option(None, "--calib", help="Calibration text: JSONL with a `text` field per line, or a text file (default: the recipe's validation text)."),
    heldout: Optional[Path] = typer.Option(None, "--heldout", help="Held-out conversations (JSONL) scored BF16 vs quantized on their test half, split by prompt hash under the recipe's seed (default: the recipe's SFT world)."),
    heldout_limit: int = typer.Option(200, "--heldout-limit", min=1, help="Held-out conversations answered per model."),
    calib_batches: int = typer.Option(16, "--calib-batches", min=1, help="Calibration batches of 4 x 256 tokens."),
    score_batches: int = typer.Option(8, "--score-batches", min=1, help="Batches the sensitivity scores are estimated on."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="Recipe whose data and SFT world give the default calibration and held-out text (default: the shipped tiny recipe)."),
    device: str = typer.Option("auto", "--device", help="auto (cuda when present: modelopt's NVFP4 kernels), cpu (NVFP4 emulated in PyTorch) or cuda."),
    overrides: list[str] = SetOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Quantize a checkpoint per operator under a budget and export it for deployment (vLLM on GPU).

    modelopt's AutoQuantize calibrates NVFP4 and FP8 on every operator and scores each one's
    sensitivity; one format per operator is chosen to minimise the summed sensitivity under the
    budget. The export is a unified Hugging Face checkpoint with its quantization config; it is
    reloaded with stagewise's own loader and scored against the BF16 checkpoint (held-out exact
    match, validation loss). --json prints the report: effective_bits, formats (module -> format),
    deltas, bf16, quantized, flop_share, table.

    \b
    Examples:
      stagewise quantize "$CKPT" --out runs/tiny/q6 --effective-bits 6
      stagewise quantize "$CKPT" --out runs/tiny/q5 --effective-bits 5 --json
      stagewise quantize "$CKPT" --out runs/tiny/qf --flop-fraction 0.4 --pin '*.mixer.experts=nvfp4'
      stagewise quantize "$CKPT" --out runs/tiny/ultra --preset ultra
    """
    from stagewise.cli.evaluate import _runtime
    from stagewise.cli.run import shipped_recipe
    from stagewise.model.checkpoint_check import check_checkpoint

    check_checkpoint(checkpoint)
    block_values = {"formats": [f.strip() for f in formats.split(",") if f.strip()], "effective_bits": effective_bits,
                    "budget": "flops" if flop_fraction is not None else "effective_bits", "flop_fraction": flop_fraction,
                    "preset": preset, "pins": _pins(pin), "calib_batches": calib_batches, "score_batches": score_batches,
                    "heldout_limit": heldout_limit,
                    "keep_bf16": [p.strip() for p in keep_bf16.split(",") if p.strip()] if keep_bf16 is not None else None}
    stage = _block(block_values)
    recipe = recipe or shipped_recipe("tiny.yaml")
    loaded = load(recipe, overrides)
    runtime = _runtime(device, recipe, overrides)
    report = _quantize(checkpoint, out, stage, loaded, calib, heldout, runtime.device)

    def text() -> None:
        from stagewise.quant.report import summary_lines

        typer.echo(f"quantized {checkpoint} -> {out}")
        for line in summary_lines(report):
            typer.echo(f"  {line}")

    emit({k: v for k, v in report.items() if k != "table"} | {"table": report["table"]}, as_json, text)


def _quantize(checkpoint: Path, out: Path, stage, loaded, calib: Optional[Path], heldout: Optional[Path], device: str) -> dict:
    """The quantize stage's inputs from the recipe, then its task, outside Prefect (the tasks' `.fn`)."""
    from stagewise.flows.quantize import data_root, export_meta, heldout_path, inputs_for, select
    from stagewise.flows.stage import Upstream
    from stagewise.recipe import recipe_hash
    from stagewise.tasks.data import prepare_data_task
    from stagewise.tasks.quantize import quantize_checkpoint
    from stagewise.tasks.sft_data import sft_world_task

    r = loaded.recipe
    block = select(r.model_copy(update={"stages": r.stages.model_copy(update={"quantize": stage})}))
    if heldout is not None:
        block.stage.heldout = str(heldout.resolve())
    base = str(Path(loaded.path).parent)
    root = data_root(block, Upstream(), r.workdir, r.seed, base, prepare=prepare_data_task.fn)
    held = heldout_path(block, r.workdir, r.seed, base, world=sft_world_task.fn)
    batches, scoring = inputs_for(stage, str(checkpoint), root, str(calib) if calib else None, held, r.eval, r.seed)
    with contextlib.redirect_stdout(sys.stderr):  # modelopt prints its progress; stdout is the report's
        return quantize_checkpoint.fn(str(checkpoint), stage, batches, scoring, str(out), device,
                                      export_meta(str(checkpoint), recipe_hash(r)))
