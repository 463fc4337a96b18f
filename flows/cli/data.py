"""`stagewise data prepare|curate|pack`: turn raw text and conversations into training data.

The data group has its own Typer app (`data_app`, mounted as `data` by flows.cli) because its
three commands share a purpose distinct from training: build a recipe's tokenizer and token
shards, curate SFT conversations (filters, dedup, rejects with reasons), and render and pack
curated conversations to measure packing efficiency. The data libraries are imported inside
each command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from flows.cli.options import DebugOpt, JsonOpt, RecipeArg, SetOpt, load
from flows.cli.output import emit, guarded
from flows.recipe_errors import BadInput

data_app = typer.Typer(help="Data commands: prepare a recipe's tokenizer and token shards; curate and pack SFT conversations.", no_args_is_help=True)

@data_app.command("prepare")
@guarded
def data_prepare(
    recipe: Path = RecipeArg,
    overrides: list[str] = SetOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Build (or reuse) a recipe's tokenizer and token shards under its workdir.

    \b
    Example:
      stagewise data prepare recipes/tiny.yaml
    """
    loaded = load(recipe, overrides)
    r = loaded.recipe
    from data.prepare import prepare_data

    prepared = prepare_data(r.data, r.tokenizer, Path(r.workdir), r.seed, base_dir=loaded.base_dir)

    def text() -> None:
        typer.echo(f"{'reused' if prepared.reused else 'prepared'} {prepared.root}")
        typer.echo(f"tokenizer: {prepared.tokenizer_dir}")
        for name, s in prepared.sources.items():
            typer.echo(f"  {name:<14} {s.train_tokens:>12,} train tokens {s.val_tokens:>10,} val {s.docs:>8,} docs")

    emit(prepared, as_json, text)


def _curate_config(path: Optional[Path]):
    """CurateConfig from a YAML file (its fields at the top level), or the defaults."""
    from pydantic import ValidationError

    from data.sft_config import CurateConfig

    if path is None:
        return CurateConfig()
    if not path.is_file():
        raise BadInput(f"config file not found: {path}")
    import yaml

    from data.errors import decode_utf8

    try:
        return CurateConfig.model_validate(yaml.safe_load(decode_utf8(path.read_bytes(), str(path))) or {})
    except (ValidationError, yaml.YAMLError) as e:
        raise BadInput(f"{path}: {e}") from e


@data_app.command("curate")
@guarded
def data_curate(
    source: Path = typer.Argument(..., help="Conversations, one JSON object per line (OpenAI messages format).", show_default=False),
    out: Path = typer.Option(..., "--out", help="Directory for <name>.jsonl (kept), <name>.rejects.jsonl and <name>.report.json."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML with CurateConfig fields (thresholds, dedup, limits)."),
    max_reject_rate: Optional[float] = typer.Option(None, "--max-reject-rate", min=0.0, max=1.0, help="Override the config's max_reject_rate."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Curate SFT conversations: structural checks, repetition filters, exact and MinHash dedup, length limits.

    Every rejected line goes to the rejects file with its line number and reason. A source
    rejecting more than max_reject_rate of its lines is an error (exit 2).

    \b
    Example:
      stagewise data curate runs/tiny/sft_world/*/sft_arithmetic.jsonl --out runs/tiny/curated --json
    """
    from data.curate import CurationError, curate

    if not source.is_file():
        raise BadInput(f"not found: {source}")
    cfg = _curate_config(config)
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = curate(source, cfg, out / f"{source.stem}.rejects.jsonl", max_reject_rate=max_reject_rate)
    except CurationError as e:
        raise BadInput(str(e)) from e
    kept_path = out / f"{source.stem}.jsonl"
    kept_path.write_text("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in report.kept), encoding="utf-8")
    summary = {**report.to_dict(), "kept_path": str(kept_path)}
    (out / f"{source.stem}.report.json").write_text(json.dumps(summary, indent=2))

    def text() -> None:
        typer.echo(f"{source}: kept {summary['kept']} of {summary['total']} -> {kept_path}")
        for reason, n in summary["rejected"].items():
            typer.echo(f"  rejected {n:>6}  {reason}")

    emit(summary, as_json, text)


def _read_conversations(path: Path) -> list[dict]:
    """Curated conversations; a line that is not a well-formed conversation is bad input."""
    from data.curate.structural import Rejected, check_structure, parse_line

    convs = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                conv = parse_line(line)
                check_structure(conv)
            except Rejected as r:
                raise BadInput(f"{path}:{lineno}: {r} (curate it first: stagewise data curate)") from None
            convs.append(conv)
    return convs


@data_app.command("pack")
@guarded
def data_pack(
    source: Path = typer.Argument(..., help="Curated conversations (JSONL).", show_default=False),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Tokenizer directory (the chat template is added when missing)."),
    pack_size: int = typer.Option(..., "--pack-size", min=1, help="Tokens per pack (training sequence length)."),
    reasoning_off: float = typer.Option(0.0, "--reasoning-off-fraction", min=0.0, max=1.0, help="Fraction rendered with reasoning off."),
    seed: int = typer.Option(0, "--seed", help="Seed of the reasoning-off choice."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the packed rows here (.npz)."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Render conversations with the chat template and best-fit-decreasing pack them.

    Reports packs, efficiency (packed tokens / pack capacity), conversations dropped for
    being longer than a pack, and supervised (assistant) tokens.

    \b
    Example:
      stagewise data pack runs/tiny/curated/sft_arithmetic.jsonl --tokenizer runs/tiny/stages/pretrain-*/step-00000360 --pack-size 1024 --json
    """
    if not source.is_file():
        raise BadInput(f"not found: {source}")
    from model.checkpoint_check import check_tokenizer

    check_tokenizer(tokenizer)
    from data.chat import install_chat_template
    from data.sft_config import PackingConfig
    from data.sft_data import pack_conversations, save_packed
    from data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    if not getattr(tok, "chat_template", None):
        install_chat_template(tok)
    packed = pack_conversations(_read_conversations(source), tok, PackingConfig(pack_size=pack_size), reasoning_off, seed)
    summary = packed.to_dict()
    if out is not None:
        summary["out"] = str(save_packed(out, packed.rows))

    def text() -> None:
        typer.echo(f"{summary['conversations']} conversations -> {summary['packs']} packs of {pack_size} tokens, "
                   f"efficiency {summary['efficiency']:.2%}, dropped {summary['dropped']}, "
                   f"supervised tokens {summary['supervised_tokens']:,}")

    emit(summary, as_json, text)
