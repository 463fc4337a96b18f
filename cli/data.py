"""`stagewise data prepare|build|curate|pack|profile`: turn raw text and conversations into training data.

The data group has its own Typer app (`data_app`, mounted as `data` by stagewise.cli) because its
commands share a purpose distinct from training: build a recipe's tokenizer and token
shards, write its sources as Megatron indexed shards past one process (`build`), curate SFT conversations (filters, dedup, rejects with reasons), render and pack
curated conversations to measure packing efficiency, and profile a source or a whole recipe
for skew (lengths, turns, reasoning, tools, rejects, repetition, duplicates) before training on
it. The data libraries are imported inside each command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

import typer

from stagewise.cli.options import DebugOpt, JsonOpt, RecipeArg, SetOpt, load
from stagewise.cli.output import emit, guarded
from stagewise.recipe.errors import BadInput

data_app = typer.Typer(help="Data commands: prepare a recipe's tokenizer and token shards; build Megatron indexed shards "
                                 "in process or on Ray; curate and pack SFT conversations; "
                                 "profile sources for skew.", no_args_is_help=True)

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
    from stagewise.data.prepare import prepare_data

    prepared = prepare_data(r.data, r.tokenizer, Path(r.workdir), r.seed, base_dir=loaded.base_dir)

    def text() -> None:
        typer.echo(f"{'reused' if prepared.reused else 'prepared'} {prepared.root}")
        typer.echo(f"tokenizer: {prepared.tokenizer_dir}")
        for name, s in prepared.sources.items():
            typer.echo(f"  {name:<14} {s.train_tokens:>12,} train tokens {s.val_tokens:>10,} val {s.docs:>8,} docs")

    emit(prepared, as_json, text)


@data_app.command("build")
@guarded
def data_build(
    recipe: Path = RecipeArg,
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default: <workdir>/corpus). A rerun into it "
                                       "redoes only unfinished work units; another corpus's plan there is refused."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="HF tokenizer directory (default: the recipe's "
                                             "tokenizer.path, else the tokenizer `data prepare` built for it)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the work units per source, the executor and (with "
                                 "data.build.dedup.engine=curator) the NeMo Curator calls near dedup would make, and "
                                 "whether they can run here; reads only the inputs' sizes and writes nothing (but the demo world, "
                                 "when the recipe has one and it is not made yet)."),
    overrides: list[str] = SetOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Write a recipe's sources as Megatron indexed shards: plan -> filter -> dedup -> tokenize, per work unit.

    The sources are cut into work units (data.build.shard_mb of input each) by a plan fixed first, so
    the output never depends on the executor: data.build.executor=in_process runs here, ray runs Ray
    tasks on a local cluster started for the build (or the one at data.build.ray.address), and both
    write byte-identical shards and corpus.json. Each unit is written atomically; after a crash the
    same command redoes only the units that had not finished. Megatron-Bridge reads the prefixes in
    corpus.json as they are (no conversion). A source may be a local path or an fsspec URL of JSONL or
    parquet files (s3://bucket/web/*.jsonl, where s3fs is installed): each worker reads its units itself.

    \b
    Examples:
      stagewise data build recipes/tiny.yaml
      stagewise data build recipes/tiny.yaml --set data.build.executor=ray --set data.build.ray.workers=2
      stagewise data build my.yaml --set data.build.ray.address=10.0.0.5:6379 --out /shared/corpus --json
      stagewise data build my.yaml --set data.build.dedup.engine=curator --dry-run
    """
    loaded = load(recipe, overrides)
    r = loaded.recipe
    from stagewise.data.corpus.build import build_for_recipe

    if dry_run:
        _preview_build(loaded, out, as_json)
        return
    if tokenizer is not None and not tokenizer.is_dir():
        raise BadInput(f"--tokenizer {tokenizer}: not a directory")
    result = build_for_recipe(r.data, r.tokenizer, Path(r.workdir), r.seed, loaded.base_dir, out, tokenizer,
                              progress=not as_json)

    def text() -> None:
        rep = result.report
        typer.echo(f"built {result.out} ({rep['executor']}, {rep['units']} work units, {rep['units_written_now']} "
                   f"written now; {rep['tokens_per_s']:,.0f} tokens/s)")
        for name, s in result.manifest["sources"].items():
            rejected = ", ".join(f"{k} {v}" for k, v in s["rejected"].items()) or "none"
            typer.echo(f"  {name:<14} {s['train_tokens']:>12,} train tokens {s['val_tokens']:>10,} val "
                       f"{s['kept']:>8,} of {s['docs']:,} docs kept; duplicates: {s['duplicates']['exact']:,} exact, "
                       f"{s['duplicates']['near']:,} near; rejected: {rejected}")

    emit(result, as_json, text)


def _preview_build(loaded, out: Optional[Path], as_json: bool) -> None:
    """`data build --dry-run`: data/corpus/build.py preview_corpus, as text or JSON."""
    from stagewise.data.corpus.build import preview_corpus
    from stagewise.data.prepare import ensure_world

    r = loaded.recipe
    world = ensure_world(r.data.world, r.seed, Path(r.workdir)) if r.data.world is not None else None
    preview = preview_corpus(r.data.sources, loaded.base_dir, world, r.data.build, out or Path(r.workdir) / "corpus")

    def text() -> None:
        typer.echo(f"would build {preview['out']}: {preview['units']} work units, {preview['input_bytes']:,} input "
                   f"bytes, executor {preview['executor']} ({preview['workers']} worker(s)); dedup exact "
                   f"{'on' if preview['dedup']['exact'] else 'off'}, near {preview['dedup']['near'] or 'off'}")
        for name, s in preview["sources"].items():
            typer.echo(f"  {name:<14} {s['files']:>5} file(s) {s['units']:>6} unit(s) {s['bytes']:>15,} bytes")
        if preview["curator"] is not None:
            missing = preview["curator"]["missing"]
            typer.echo(f"near dedup through NeMo Curator ({'can run here' if missing is None else 'cannot run here: ' + missing}):")
            for step in ("fuzzy", "removal"):
                call = preview["curator"]["plan"][step]
                kwargs = {k: (f"[{len(v)} staged parquet files]" if k == "input_path" else v)
                          for k, v in call["kwargs"].items()}
                typer.echo(f"  {call['class'].rsplit('.', 1)[1]}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")

    emit(preview, as_json, text)


def _curate_config(path: Optional[Path]):
    """CurateConfig from a YAML file (its fields at the top level), or the defaults."""
    from pydantic import ValidationError

    from stagewise.data.sft_config import CurateConfig

    if path is None:
        return CurateConfig()
    if not path.is_file():
        raise BadInput(f"config file not found: {path}")
    import yaml

    from stagewise.data.errors import decode_utf8

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
    from stagewise.data.curate import CurationError, curate

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


def _chat_tokenizer(path: Path):
    """A checked tokenizer directory, loaded with the chat template (added in memory when missing)."""
    from stagewise.data.chat import load_chat_tokenizer
    from stagewise.model.checkpoint_check import check_tokenizer

    check_tokenizer(path)
    return load_chat_tokenizer(path)


def _switch(text: Optional[str]):
    """--reasoning-switch read as the recipe's field is (YAML, then its schema), or BadInput naming the flag."""
    import yaml
    from pydantic import TypeAdapter, ValidationError

    from stagewise.data.reasoning_switch import SwitchSetting

    if text is None:
        return "auto"
    try:
        return TypeAdapter(SwitchSetting).validate_python(yaml.safe_load(text))
    except yaml.YAMLError as e:
        raise BadInput(f"--reasoning-switch: not YAML: {e}") from None
    except ValidationError as e:
        why = "; ".join(": ".join(x for x in (".".join(str(p) for p in err["loc"]), err["msg"]) if x) for err in e.errors())
        raise BadInput(f"--reasoning-switch: {why} (got {text!r})") from None


def _read_conversations(path: Path) -> list[dict]:
    """Curated conversations; a line that is not a well-formed conversation is bad input."""
    from stagewise.data.curate.structural import Rejected, check_structure, parse_line

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
    seed: int = typer.Option(0, "--seed", help="Seed of the reasoning-off choice (an SFT sub-stage i uses the recipe's seed + i)."),
    reasoning_switch: Optional[str] = typer.Option(
        None, "--reasoning-switch", help="How the template turns reasoning off, as the recipe's tokenizer.reasoning_switch "
        "(YAML): auto (the default), '{kind: system_flag, when_off: /no_think, when_on: /think}', "
        "'{kind: kwarg, name: enable_thinking}' or '{kind: none}'."),
    reasoning_content: Literal["keep", "drop"] = typer.Option(
        "keep", "--reasoning-content", help="keep: train the assistant turns' reasoning traces; drop: discard them and "
        "train the final responses (the recipe's stages.sft.data.reasoning_content; for a template that writes no "
        "reasoning, e.g. Llama 3.1's)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the packed rows here (.npz)."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Render conversations with the chat template and best-fit-decreasing pack them.

    Reports packs, efficiency (packed tokens / pack capacity), conversations dropped for
    being longer than a pack, supervised (assistant) tokens and conversations rendered with
    reasoning off: with the sub-stage's fraction, seed and the recipe's switch, what the SFT
    stage packs from the same conversations.

    \b
    Example:
      stagewise data pack runs/tiny/curated/sft_arithmetic.jsonl --tokenizer runs/tiny/stages/pretrain-*/step-00000360 --pack-size 1024 --json
    """
    if not source.is_file():
        raise BadInput(f"not found: {source}")
    from stagewise.data.sft_config import PackingConfig
    from stagewise.data.sft_packs import pack_conversations, save_packed
    from stagewise.data.sft_rows import without_reasoning

    switch = _switch(reasoning_switch)
    tok = _chat_tokenizer(tokenizer)
    convs = _read_conversations(source)
    if reasoning_content == "drop":
        convs = [without_reasoning(c) for c in convs]
    packed = pack_conversations(convs, tok, PackingConfig(pack_size=pack_size), reasoning_off, seed, switch)
    summary = packed.to_dict()
    if out is not None:
        summary["out"] = str(save_packed(out, packed.rows))

    def text() -> None:
        typer.echo(f"{summary['conversations']} conversations -> {summary['packs']} packs of {pack_size} tokens, "
                   f"efficiency {summary['efficiency']:.2%}, dropped {summary['dropped']}, "
                   f"supervised tokens {summary['supervised_tokens']:,}")

    emit(summary, as_json, text)


# --------------------------------------------------------------------------- profile

def _prepared_tokenizer(recipe: Path, loaded) -> Path:
    """The recipe's prepared tokenizer (`<workdir>/data/<digest>/tokenizer`), else BadInput saying what to run."""
    from stagewise.data.prepare import find_prepared

    r = loaded.recipe
    prepared = find_prepared(r.data, r.tokenizer, Path(r.workdir), r.seed, loaded.base_dir)
    if prepared is None:
        raise BadInput(f"{recipe}: no prepared tokenizer under {Path(r.workdir) / 'data'} for this recipe; run "
                       f"`stagewise data prepare {recipe}` first, or pass --tokenizer DIR")
    return prepared.tokenizer_dir


def _text_profiles(loaded, tok, cfg, limit: Optional[int]) -> list:
    """Every pretraining source of the recipe (its demo world generated first when missing)."""
    from stagewise.data.prepare import ensure_world
    from stagewise.data.profile import profile_texts
    from stagewise.data.sources import iter_texts, resolve_path

    r, base = loaded.recipe, loaded.base_dir
    world = ensure_world(r.data.world, r.seed, Path(r.workdir)) if r.data.world is not None else None
    limits = {"pretrain": r.stages.pretrain.seq_length} if r.stages.pretrain is not None else {}
    out = []
    for src in r.data.sources:
        bad: dict[str, int] = {}
        p = profile_texts(src.name, resolve_path(src.path, base, world), iter_texts(src, base, world, bad), tok, limits,
                          cfg, limit=limit)
        out.append(p.model_copy(update={"bad_lines": bad.get(src.name, 0)}))
    return out


def _sft_profiles(loaded, tok) -> list:
    """The recipe's SFT sources as the SFT stage curates them: the same world and curated directories
    under the workdir (made here when missing, reused when the stage or an earlier profile made them)."""
    from stagewise.data.curate import CurationError
    from stagewise.data.profile import profile_curated
    from stagewise.flows.sft import select
    from stagewise.store.steps import value_of
    from stagewise.tasks.sft_data import curate_task, sft_world_task

    r, block = loaded.recipe, select(loaded.recipe)
    data, workdir = block.stage.data, str(r.workdir)
    world = None
    if data.world is not None:
        world = value_of(sft_world_task.fn(data.world, data.world.entities or block.world_entities, r.seed, workdir))
    try:
        curated = value_of(curate_task.fn(data.sources, data.curate, world, str(loaded.base_dir), workdir))
    except (CurationError, FileNotFoundError) as e:
        raise BadInput(f"stages.sft.data: {e}") from None
    return profile_curated(Path(curated.root), data.sources, tok, block.stage.stages, data.curate)


def _recipe_profile(recipe: Path, overrides: list[str], tokenizer: Optional[Path], limit: Optional[int]):
    """(report, default output directory, file stem) for every source of a recipe."""
    from stagewise.data.profile import build_profile
    from stagewise.data.sft_config import CurateConfig

    loaded = load(recipe, overrides)
    r = loaded.recipe
    tok_dir = tokenizer or _prepared_tokenizer(recipe, loaded)
    tok = _chat_tokenizer(tok_dir)
    cfg = r.stages.sft.data.curate if r.stages.sft is not None else CurateConfig()
    sft = _sft_profiles(loaded, tok) if r.stages.sft is not None else []
    report = build_profile(_text_profiles(loaded, tok, cfg, limit), sft, str(tok_dir), cfg)
    return report, Path(r.workdir) / "data_profile", "profile"


def _file_profile(source: Path, tokenizer: Optional[Path], seq_length: Optional[int], limit: Optional[int]):
    """(report, default output directory, file stem) for one JSONL file."""
    from stagewise.data.profile import profile_file

    if tokenizer is None:
        raise BadInput(f"{source}: token lengths need a tokenizer: pass --tokenizer DIR (a prepared tokenizer, "
                       "runs/<name>/data/<digest>/tokenizer, or a checkpoint directory)")
    limits = {"seq_length": seq_length} if seq_length else {}
    report = profile_file(source, _chat_tokenizer(tokenizer), str(tokenizer), limits, limit=limit)
    return report, Path.cwd(), f"{source.stem}.profile"


def _profile_text(report: dict) -> None:
    """The report as a few lines per source and the warnings."""
    for s in [*report["text_sources"], *report["sft_sources"]]:
        t = s["tokens"]
        items = s.get("documents", s.get("conversations"))
        typer.echo(f"{s['name']:<14} {s['kind']:<13} {items:>7,} items  tokens mean {t['mean']:>8,.1f} "
                   f"p50 {t['p50']:>6,} p90 {t['p90']:>6,} p99 {t['p99']:>6,} max {t['max']:>7,}  "
                   f"repetition {s['repetition']:.3f}")
    for d in report["domains"]:
        typer.echo(f"  domain {d['domain']:<14} {d['conversation_share']:>6.1%} of conversations, "
                   f"{d['token_share']:>6.1%} of tokens")
    tools = report["tools"]
    if tools["calls"]:
        typer.echo(f"  tools: {tools['calls']:,} calls, {tools['top_tool']} {tools['top_share']:.0%}")
    typer.echo(f"{len(report['warnings'])} warning(s)")
    for w in report["warnings"]:
        typer.echo(f"  - {w['message']}")
    typer.echo(f"wrote {report['outputs']['json']} and {report['outputs']['png']}")


@data_app.command("profile")
@guarded
def data_profile(
    target: Path = typer.Argument(..., help="A JSONL source (text rows or conversations, told apart by its lines) "
                                            "or a recipe (.yaml: every source it names).", show_default=False,
                                metavar="SOURCE|RECIPE"),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer directory (default for a recipe: "
                                             "its prepared tokenizer under the workdir; a SOURCE needs one)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for the JSON report and PNG dashboard "
                                       "(default: <workdir>/data_profile/profile.* for a recipe, "
                                       "./<source stem>.profile.* for a SOURCE)."),
    seq_length: Optional[int] = typer.Option(None, "--seq-length", min=1, help="A SOURCE's sequence/pack length "
                                             "(warns when its p99 is longer; a recipe uses its stages')."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Profile at most the first N documents of each "
                                        "pretraining text source (default: all)."),
    overrides: list[str] = SetOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Profile training data for skew: token lengths per source and domain, turns, reasoning traces,
    tool calls per tool, curation's reject reasons, n-gram repetition and near duplicates, with a
    warning (and the number behind it) for each skew.

    A recipe profiles its pretraining sources and its SFT sources as the SFT stage curates them
    (the demo worlds and curated files are made under the workdir when missing, as the stages
    would make them). Writes a JSON report and a PNG dashboard; --json prints the report.

    \b
    Example:
      stagewise data profile recipes/tiny.yaml
      stagewise data profile runs/tiny/sft_world/*/sft_calculator.jsonl --tokenizer runs/tiny/data/*/tokenizer --json
    """
    if not target.is_file():
        raise BadInput(f"not found: {target}")
    if target.suffix in (".yaml", ".yml"):
        report, out_dir, stem = _recipe_profile(target, overrides, tokenizer, limit)
    elif overrides:
        raise BadInput("--set applies to a recipe, not to a SOURCE file")
    else:
        report, out_dir, stem = _file_profile(target, tokenizer, seq_length, limit)
    from stagewise.eval.data_profile_files import write_profile

    paths = write_profile(out or out_dir, report, stem, f"Data profile of {target.name}")
    summary = {**report.model_dump(mode="json"), "outputs": paths}
    emit(summary, as_json, lambda: _profile_text(summary))
