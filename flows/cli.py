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
data_app = typer.Typer(help="Data commands: prepare a recipe's tokenizer and token shards.", no_args_is_help=True)
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


def main() -> None:
    """Console-script entry point (`stagewise = flows.cli:main`)."""
    app()


if __name__ == "__main__":
    main()
