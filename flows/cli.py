"""The `stagewise` command: run recipes, prepare data, size models, show recipes.

    stagewise demo                          # the tiny CPU demo, end to end
    stagewise run recipes/tiny.yaml --set stages.pretrain.tokens=491520
    stagewise recipe show recipes/nemotron-3-nano-4b.yaml

Exit codes: 0 success, 2 bad input (a recipe error, a missing file, a bad option: one clear
message, no traceback), 1 a failure while running (the error; the traceback only with
`--debug` or STAGEWISE_DEBUG=1). torch, transformers, prefect and mlflow are imported
inside the commands that need them, so `stagewise --help` stays fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import typer

app = typer.Typer(
    name="stagewise",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
data_app = typer.Typer(help="Data commands: prepare a recipe's tokenizer and token shards; curate and pack SFT conversations.", no_args_is_help=True)
recipe_app = typer.Typer(help="Recipe commands: show a resolved recipe, print the JSON schema.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(recipe_app, name="recipe")

_DEBUG = {"on": False}
_JSON_OUT: dict[str, Any] = {"file": None}  # the real stdout while --json sends other prints to stderr

RecipeArg = typer.Argument(..., help="Recipe YAML file.", show_default=False)
SetOpt = typer.Option(
    [], "--set", "-s", metavar="KEY=VALUE",
    help="Override a field, e.g. --set stages.pretrain.tokens=500000 or --set stages.pretrain.phases[1].until=0.9 "
         "(value parsed as YAML; repeatable).",
)
JsonOpt = typer.Option(False, "--json", help="Print the result as JSON on stdout.")
DebugOpt = typer.Option(False, "--debug", help="Show the full traceback of a failure (or STAGEWISE_DEBUG=1).")


class BadInput(Exception):
    """Input the user must fix (exit 2), found by the CLI itself."""


def _jsonable(obj: Any) -> Any:
    """Reports from the libraries (dataclasses, pydantic models, Paths) as plain JSON data."""
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _emit(data: Any, as_json: bool, text: Callable[[], None] | None = None) -> None:
    """JSON on stdout, or the human rendering (default: key: value lines)."""
    if as_json:
        typer.echo(json.dumps(_jsonable(data), indent=2), file=_JSON_OUT["file"])
    elif text is not None:
        text()
    else:
        _print_tree(_jsonable(data))


def _print_tree(data: Any, indent: int = 0) -> None:
    pad = "  " * indent
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(v, (dict, list)) and v:
                typer.echo(f"{pad}{k}:")
                _print_tree(v, indent + 1)
            else:
                typer.echo(f"{pad}{k}: {v}")
    elif isinstance(data, list):
        for v in data:
            if isinstance(v, (dict, list)):
                typer.echo(f"{pad}-")
                _print_tree(v, indent + 1)
            else:
                typer.echo(f"{pad}- {v}")
    else:
        typer.echo(f"{pad}{data}")


def _fail(message: str, code: int, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"ok": False, "exit_code": code, "error": message}, indent=2), file=_JSON_OUT["file"])
    else:
        typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _guarded(fn: Callable) -> Callable:
    """Map exceptions to exit codes: bad input 2 (message only), a failure 1 (+ traceback on --debug).

    With --json, stdout carries only the JSON document: whatever the work prints meanwhile
    (progress bars, library chatter) is sent to stderr.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from flows.recipe import RecipeError

        as_json = bool(kwargs.get("as_json"))
        debug = bool(kwargs.get("debug")) or _DEBUG["on"] or os.environ.get("STAGEWISE_DEBUG", "") not in ("", "0")
        _JSON_OUT["file"] = sys.stdout
        try:
            with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except (RecipeError, BadInput) as e:
            _fail(str(e), 2, as_json)
        except KeyboardInterrupt:
            _fail("interrupted", 130, as_json)
        except Exception as e:  # a failure while running
            if debug:
                traceback.print_exc(file=sys.stderr)
            hint = "" if debug else "\n(run with --debug or STAGEWISE_DEBUG=1 for the traceback)"
            _fail(f"{type(e).__name__}: {e}{hint}", 1, as_json)

    return wrapper


def _load(recipe: Path, overrides: list[str]):
    from flows.recipe import load_recipe

    return load_recipe(recipe, overrides)


def shipped_recipe(name: str) -> Path:
    """A recipe shipped with stagewise: next to the package (source checkout) or in ./recipes."""
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "recipes" / name).is_file():
            return root / "recipes" / name
    raise BadInput(f"cannot find the shipped recipe recipes/{name} (looked next to the package and in {Path.cwd()})")


@app.callback()
def _main(debug: bool = DebugOpt) -> None:
    """Train NemotronH hybrid models stage by stage from one YAML recipe (Prefect + MLflow).

    Start with `stagewise demo`, then `stagewise recipe show recipes/tiny.yaml`.
    """
    _DEBUG["on"] = debug


# --------------------------------------------------------------------------- run / demo

def _run(loaded, stages: Optional[str], resume: bool) -> dict:
    from flows.recipe import select_stages

    chosen = select_stages(loaded.recipe, stages)  # bad names exit 2 before Prefect starts
    from flows.pipeline import run_pipeline

    return run_pipeline(loaded, stages=chosen, resume=resume)


@app.command()
@_guarded
def run(
    recipe: Path = RecipeArg,
    stages: Optional[str] = typer.Option(None, "--stages", help="Comma-separated stages to run (default: every stage in the recipe)."),
    overrides: list[str] = SetOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue each stage from its latest checkpoint."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Run a recipe's stages as one Prefect flow, tracked in MLflow.

    \b
    Example:
      stagewise run recipes/tiny.yaml --stages pretrain --set stages.pretrain.tokens=491520
    """
    loaded = _load(recipe, overrides)
    _emit(_run(loaded, stages, resume), as_json)


@app.command()
@_guarded
def demo(
    overrides: list[str] = SetOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Train the tiny CPU demo end to end: world data, tokenizer, phased pretraining, MLflow.

    Runs the shipped recipes/tiny.yaml (minutes on a laptop) and says where the results are.

    \b
    Example:
      stagewise demo --set stages.pretrain.tokens=491520
    """
    loaded = _load(shipped_recipe("tiny.yaml"), overrides)
    result = _run(loaded, None, resume)
    workdir = result.get("workdir", str(Path(loaded.recipe.workdir).resolve()))
    uri = result.get("tracking_uri") or f"sqlite:///{Path(workdir) / 'mlflow.db'}"
    result = {**result, "mlflow_ui": f"mlflow ui --backend-store-uri {uri}"}

    def text() -> None:
        _print_tree(_jsonable(result))
        typer.echo(f"\nResults are under {workdir}.\nOpen the MLflow UI:  {result['mlflow_ui']}"
                   f"  (then http://127.0.0.1:5000, experiment '{result.get('experiment', loaded.recipe.name)}')")

    _emit(result, as_json, text)


# --------------------------------------------------------------------------- data

@data_app.command("prepare")
@_guarded
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
    loaded = _load(recipe, overrides)
    r = loaded.recipe
    from data.prepare import prepare_data

    prepared = prepare_data(r.data, r.tokenizer, Path(r.workdir), r.seed, base_dir=loaded.base_dir)

    def text() -> None:
        typer.echo(f"{'reused' if prepared.reused else 'prepared'} {prepared.root}")
        typer.echo(f"tokenizer: {prepared.tokenizer_dir}")
        for name, s in prepared.sources.items():
            typer.echo(f"  {name:<14} {s.train_tokens:>12,} train tokens {s.val_tokens:>10,} val {s.docs:>8,} docs")

    _emit(prepared, as_json, text)


def _curate_config(path: Optional[Path]):
    """CurateConfig from a YAML file (its fields at the top level), or the defaults."""
    from pydantic import ValidationError

    from data.sft_config import CurateConfig

    if path is None:
        return CurateConfig()
    if not path.is_file():
        raise BadInput(f"config file not found: {path}")
    import yaml

    try:
        return CurateConfig.model_validate(yaml.safe_load(path.read_text()) or {})
    except (ValidationError, yaml.YAMLError) as e:
        raise BadInput(f"{path}: {e}") from e


@data_app.command("curate")
@_guarded
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
      stagewise data curate runs/tiny/world/sft_dirty.jsonl --out runs/tiny/curated --json
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

    _emit(summary, as_json, text)


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
@_guarded
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
      stagewise data pack runs/tiny/curated/sft_arithmetic.jsonl --tokenizer runs/tiny/data/<hash>/tokenizer --pack-size 1024 --json
    """
    if not source.is_file():
        raise BadInput(f"not found: {source}")
    if not (tokenizer.is_dir() and any(tokenizer.glob("tokenizer*.json"))):
        raise BadInput(f"{tokenizer} is not a tokenizer directory")
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

    _emit(summary, as_json, text)


# --------------------------------------------------------------------------- inspect

def _inspect_target(target: Optional[Path], preset: Optional[str], overrides: list[str]):
    """(ModelConfig, vocab_size, seq_length, micro_batch, precision) for a recipe, checkpoint or preset."""
    from model.config import ModelConfig
    from model.presets import preset_names

    if preset is not None:
        if target is not None:
            raise BadInput("give a recipe/checkpoint or --preset, not both")
        if preset not in preset_names():
            raise BadInput(f"unknown preset {preset!r}; presets: {', '.join(preset_names())}")
        return ModelConfig(preset=preset), None, 4096, 1, "bf16"
    if target is None:
        raise BadInput("give a recipe (.yaml), a checkpoint directory, --preset NAME or --presets")
    if target.is_dir():
        if not (target / "config.json").is_file():
            raise BadInput(f"{target} is not a checkpoint (no config.json)")
        return ModelConfig.model_validate({"preset": None, "from": str(target)}), None, 4096, 1, "bf16"
    if target.suffix in (".yaml", ".yml") or target.is_file():
        r = _load(target, overrides).recipe
        pre = r.stages.pretrain
        if pre is None:
            return r.model, r.tokenizer.vocab_size, 4096, 1, "bf16"
        prec = "fp32" if pre.precision == "fp32" else "bf16"
        return r.model, r.tokenizer.vocab_size, pre.seq_length, pre.micro_batch, prec
    raise BadInput(f"not found: {target}")


@app.command("inspect")
@_guarded
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
    """
    if presets:
        from model.presets import preset_names

        names = preset_names()
        _emit(names, as_json, lambda: typer.echo("\n".join(names)))
        return
    cfg, vocab, seq, micro, prec = _inspect_target(target, preset, overrides)
    prec = precision or prec
    if prec not in ("bf16", "fp32"):
        raise BadInput(f"--precision must be bf16 or fp32, got {prec!r}")
    from model.inspect import inspect_model

    report = inspect_model(cfg, vocab_size or vocab, seq_length or seq, micro_batch or micro, precision=prec)

    def text() -> None:
        from rich.console import Console

        Console().print(report.render())

    _emit(report, as_json, text)


# --------------------------------------------------------------------------- recipe

@recipe_app.command("show")
@_guarded
def recipe_show(
    recipe: Path = RecipeArg,
    overrides: list[str] = SetOpt,
    raw: bool = typer.Option(False, "--raw", help="Show the merged YAML as written (after base: and --set), without defaults."),
    as_json: bool = JsonOpt,
) -> None:
    """Print the resolved recipe (base: merged, --set applied, defaults filled) and its hash.

    \b
    Example:
      stagewise recipe show recipes/nemotron-3-nano-4b.yaml --set seed=7
    """
    import yaml

    from flows.recipe import recipe_dict, recipe_hash

    loaded = _load(recipe, overrides)
    body, digest = (loaded.raw if raw else recipe_dict(loaded.recipe)), recipe_hash(loaded.recipe)
    if as_json:
        _emit({"path": str(loaded.path), "hash": digest, "recipe": body}, True)
        return
    typer.echo(f"# {loaded.path}  (recipe hash {digest})")
    typer.echo(yaml.safe_dump(body, sort_keys=False, allow_unicode=True), nl=False)


@recipe_app.command("schema")
@_guarded
def recipe_schema() -> None:
    """Print the recipe's JSON schema (every field with its description), e.g. for editor completion.

    \b
    Example:
      stagewise recipe schema > recipe.schema.json
    """
    from flows.recipe import Recipe

    schema = Recipe.model_json_schema(by_alias=True)
    schema["properties"]["base"] = {"type": "string", "description": "Inherit from this recipe file (relative path); mappings merge, lists are replaced."}
    typer.echo(json.dumps(schema, indent=2))


# --------------------------------------------------------------------------- eval / cutoffs

def _eval_tasks(suite: Optional[str], recipe: Optional[Path], tasks: Optional[str], overrides: list[str]) -> list[str]:
    """The task list from --tasks, or from --suite in the recipe's eval block."""
    if (suite is None) == (tasks is None):
        raise BadInput("give --suite NAME (with --recipe) or --tasks a,b (not both)")
    if tasks is not None:
        names = [t.strip() for t in tasks.split(",") if t.strip()]
        if not names:
            raise BadInput("--tasks: no task names given")
        return names
    if recipe is None:
        raise BadInput(f"--suite {suite}: suites live in a recipe's eval block; add --recipe RECIPE (or use --tasks)")
    from eval.harness import UnknownSuiteError, resolve_suite

    try:
        return resolve_suite(_load(recipe, overrides).recipe.eval, suite)
    except UnknownSuiteError as e:
        raise BadInput(str(e)) from e


@app.command("eval")
@_guarded
def eval_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory (HF format, with config.json).", show_default=False),
    suite: Optional[str] = typer.Option(None, "--suite", help="Suite name from the recipe's `eval` block."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="Recipe whose `eval` block defines --suite."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated lm-eval tasks, tags or groups instead of a suite (e.g. world, or world_lookup,arc_easy)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="At most N items per task (a quick look)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Sequences per forward pass."),
    device: str = typer.Option("cpu", "--device", help="torch device, e.g. cpu or cuda."),
    overrides: list[str] = SetOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Score a checkpoint on lm-eval benchmarks: a suite from a recipe, or tasks by name.

    Local tasks about the demo world (world_arithmetic, world_lookup, ..., tag `world`)
    run offline; standard lm-eval task names work too.

    \b
    Example:
      stagewise eval runs/tiny/pretrain/final --suite quick --recipe recipes/tiny.yaml --limit 20
      stagewise eval runs/tiny/pretrain/final --tasks world --json
    """
    names = _eval_tasks(suite, recipe, tasks, overrides)
    if not (checkpoint.is_dir() and (checkpoint / "config.json").is_file()):
        raise BadInput(f"{checkpoint} is not a checkpoint directory (no config.json)")
    from eval.harness import UnknownTaskError, run_checkpoint, task_manager

    try:
        task_manager(names)  # a typo exits 2 before the model loads
    except UnknownTaskError as e:
        raise BadInput(str(e)) from e
    result = run_checkpoint(checkpoint, names, limit=limit, batch_size=batch_size, device=device)
    report = {"checkpoint": str(checkpoint), "tasks": names, "limit": limit, "metrics": result.metrics}

    def text() -> None:
        typer.echo(f"{checkpoint}  ({', '.join(names)}{f', limit {limit}' if limit else ''})")
        width = max((len(k) for k in result.metrics), default=0)
        for key, value in result.metrics.items():
            typer.echo(f"  {key:<{width}}  {value:.4f}")

    _emit(report, as_json, text)


def _tracking_uri(uri: Optional[str]) -> str:
    """--tracking-uri, else MLFLOW_TRACKING_URI; a SQLite store must exist (reading must not create one)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise BadInput("no MLflow store: give --tracking-uri URI (e.g. sqlite:///runs/tiny/mlflow.db) or set MLFLOW_TRACKING_URI")
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise BadInput(f"no MLflow store at {uri} (file not found)")
    return uri


def _replay(tracker, runs, rule) -> list[dict]:
    """Per run: the cutoff report, or the error (a run that lacks a rule metric)."""
    from eval.cutoffs import run_cutoff
    from eval.gates import UnknownMetricError, check_metrics

    out = []
    for run in runs:
        try:
            check_metrics(rule, tracker.metric_names(run.run_id))  # names what the run has when one is missing
            histories = tracker.metric_histories(run.run_id, rule.metrics())
            out.append({**run_cutoff(run.run_id, rule, histories, run.name).to_dict(), "error": None, "_histories": histories})
        except UnknownMetricError as e:
            out.append({"run_id": run.run_id, "run_name": run.name, "cutoff": None, "guards": [], "error": str(e)})
    if out and all(r["error"] for r in out):
        raise BadInput(out[0]["error"])
    return out


def _cutoff_figure(reports: list[dict], rule, title: str):
    from eval.plots import cutoff_plot

    runs = {f"{r['run_name']} {r['run_id'][:6]}": r["_histories"] for r in reports if "_histories" in r}
    cuts = {f"{r['run_name']} {r['run_id'][:6]}": (r["cutoff"] or {}).get("tokens_seen") for r in reports if "_histories" in r}
    thresholds: dict[str, list[float]] = {}
    for _, c in rule.conditions():
        if not c.relative:
            thresholds.setdefault(c.metric, []).append(c.value)
    return cutoff_plot(runs, rule.metrics(), cuts, thresholds, title)


def _print_cutoffs(reports: list[dict]) -> None:
    for r in reports:
        head = f"run {r['run_name'] or '?'} ({r['run_id']})"
        if r["error"]:
            typer.echo(f"{head}: skipped, {r['error']}")
            continue
        cut = r["cutoff"]
        if cut is None:
            typer.echo(f"{head}: rule never held (last evaluation: step {r['last_step']}, {r['last_tokens'] or 0:,} tokens)")
        else:
            typer.echo(f"{head}: rule first held at step {cut['step']}, {cut['tokens_seen']:,} tokens")
            for metric, value in cut["values"].items():
                typer.echo(f"    {metric} = {value:.4g}")
        for g in r["guards"]:
            fmt = lambda v: "n/a" if v is None else f"{v:.4g}"  # noqa: E731
            typer.echo(f"  guard {g['metric']}: {fmt(g['at_cutoff'])} at {'cutoff' if cut else 'start'} -> "
                       f"{fmt(g['final'])} final (worst {fmt(g['worst_after'])}, {g['evaluations_after']} evaluations after)")


@app.command("cutoffs")
@_guarded
def cutoffs_cmd(
    experiment: str = typer.Option(..., "--experiment", help="MLflow experiment (by default the recipe name)."),
    stage: str = typer.Option(..., "--stage", help="Stage whose runs to replay, e.g. pretrain."),
    rule: Path = typer.Option(..., "--rule", help="YAML with a gate's all/any/guards/min_tokens (a whole gate block works too)."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of the rule's metrics over tokens with each cutoff marked."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Replay a gate rule on a stage's finished runs: where it first held, and what the guards did after.

    \b
    Example:
      stagewise cutoffs --experiment tiny --stage pretrain --rule rule.yaml \
        --tracking-uri sqlite:///runs/tiny/mlflow.db --plot cutoffs.png
    """
    from pydantic import ValidationError

    from eval.cutoffs import load_rule
    from tasks.tracking import Tracker

    if not rule.is_file():
        raise BadInput(f"rule file not found: {rule}")
    try:
        parsed = load_rule(rule)
    except (ValidationError, ValueError) as e:
        raise BadInput(f"{rule}: {e}") from e
    tracker = Tracker(_tracking_uri(tracking_uri), experiment)
    try:
        runs = tracker.find_stage_runs(experiment, stage)
    except LookupError as e:
        raise BadInput(str(e)) from e
    if not runs:
        stages = tracker.stages_in(experiment)
        raise BadInput(f"no runs of stage {stage!r} in experiment {experiment!r}; stages there: {', '.join(stages) or '(none)'}")
    # A stage trained in sub-stages (sft) gates each sub-stage in its own run; the stage's
    # own run holds only its before/after evaluations, which a rule must not be replayed on.
    runs = [r for r in runs if "stagewise.substages" not in r.tags] or runs
    reports = _replay(tracker, runs, parsed)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        _cutoff_figure(reports, parsed, f"{experiment} / {stage}: rule metrics over tokens").savefig(plot)
    for r in reports:
        r.pop("_histories", None)
    result = {"experiment": experiment, "stage": stage, "rule": str(rule), "plot": str(plot) if plot else None, "runs": reports}

    def text() -> None:
        typer.echo(f"experiment {experiment}, stage {stage}, rule {rule}: {len(reports)} run(s)")
        _print_cutoffs(reports)
        if plot is not None:
            typer.echo(f"plot: {plot}")

    _emit(result, as_json, text)


# --------------------------------------------------------------------------- merge

@app.command("merge")
@_guarded
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
      stagewise merge runs/tiny/pretrain/step-0000{40,50,60} --schedule minus-sqrt --out runs/tiny/merged
    """
    from model.merge import MANIFEST, MergeInputError, merge_checkpoints, merge_coefficients, order_by_tokens

    missing = [str(p) for p in checkpoints if not (p / "config.json").is_file()]
    if missing:
        raise BadInput(f"not a checkpoint directory (no config.json): {', '.join(missing)}")
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

    _emit(report, as_json, text)


def main() -> None:
    """Console-script entry point (`stagewise = flows.cli:main`)."""
    app()


if __name__ == "__main__":
    main()
