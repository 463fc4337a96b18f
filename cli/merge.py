"""`stagewise merge`: average checkpoints into one, tensor by tensor, with a manifest.

Merging is a standalone step (ALGORITHMS.md §2) a user runs on checkpoints already on disk,
outside any recipe; this module only validates the inputs, calls model.merge and reports the
coefficients each input received.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from stagewise.cli.options import DebugOpt, JsonOpt
from stagewise.cli.output import emit, guarded
from stagewise.recipe.errors import BadInput


@guarded
def merge_cmd(
    checkpoints: list[Path] = typer.Argument(..., help="Checkpoint directories to merge; ordered oldest first by the tokens_seen of their stagewise.json (as given when one has none).", show_default=False),
    out: Path = typer.Option(..., "--out", help="Output checkpoint directory (written atomically; replaced if it exists)."),
    schedule: str = typer.Option("minus-sqrt", "--schedule", help="Coefficients: minus-sqrt, linear or cosine (decay emulation, WSM), or uniform."),
    ordering: str = typer.Option("sequential", "--ordering", help="sequential, reversed (coefficients applied newest-first) or random (seeded by --seed)."),
    seed: int = typer.Option(0, "--seed", help="Seed of --ordering random."),
    verify: bool = typer.Option(False, "--verify", help="Re-hash every input's weights and refuse one that no longer matches its stagewise.json."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Merge checkpoints into one, tensor by tensor (ALGORITHMS.md §2), with a merge_manifest.json.

    Checkpoints whose config or tensors differ are refused (exit 2) with the first mismatch named.

    \b
    Example:
      stagewise merge runs/tiny/stages/pretrain-*/step-00000{300,330,360} --schedule minus-sqrt --out runs/tiny/merged
    """
    from stagewise.model.checkpoint_check import check_checkpoint
    from stagewise.model.merge import MANIFEST, MergeInputError, merge_checkpoints, merge_coefficients, order_by_tokens

    for p in checkpoints:
        check_checkpoint(p, nemotron=False)  # any safetensors model merges; its files must be whole
    try:
        paths = order_by_tokens(checkpoints)
        coeffs = merge_coefficients(len(paths), schedule, ordering, seed)
        merged = merge_checkpoints(paths, coeffs, out, schedule, ordering=ordering, seed=seed, verify_inputs=verify)
    except MergeInputError as e:
        raise BadInput(str(e)) from e
    manifest = json.loads((merged / MANIFEST).read_text())
    report = {"output": str(merged), **{k: manifest[k] for k in ("schedule", "ordering", "seed")},
              "tokens_seen": manifest["output"]["tokens_seen"], "weight_sha256": manifest["output"]["weight_sha256"],
              "inputs": [{k: i[k] for k in ("path", "tokens_seen", "coefficient")} for i in manifest["inputs"]]}

    def text() -> None:
        typer.echo(f"merged {len(paths)} checkpoints ({schedule}, {ordering}) -> {merged}")
        for i in report["inputs"]:
            tokens = "?" if i["tokens_seen"] is None else f"{i['tokens_seen']:,}"
            typer.echo(f"  {i['coefficient']:.4f}  {i['path']}  ({tokens} tokens)")

    emit(report, as_json, text)
