"""`stagewise eval` and `stagewise cutoffs`: measure checkpoints and replay gate rules.

Both commands judge training after the fact: `eval` scores a checkpoint on lm-eval tasks (a
suite from a recipe's eval block, or tasks by name); `cutoffs` replays a gate rule on a
stage's finished MLflow runs to show where it first held and what its guards did afterwards.
The module is not called `eval` so that it never shadows the builtin inside the package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.options import DebugOpt, ExperimentOpt, JsonOpt, RuleOpt, SetOpt, TrackingUriOpt, load
from stagewise.cli.output import emit, guarded
from stagewise.recipe.errors import BadInput


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
    from stagewise.eval.harness import UnknownSuiteError, resolve_suite

    try:
        return resolve_suite(load(recipe, overrides).recipe.eval, suite)
    except UnknownSuiteError as e:
        raise BadInput(str(e)) from e


def _runtime(device: str, recipe: Optional[Path], overrides: list[str]):
    """Where to evaluate: --device when given, else the recipe's runtime block, else auto (exit 2 when unavailable)."""
    from stagewise.model.runtime import RuntimeConfig, RuntimeUnavailable, resolve_runtime

    if device not in ("auto", "cpu", "cuda"):
        raise BadInput(f"--device: expected auto, cpu or cuda, got {device!r}")
    cfg = RuntimeConfig(device=device)
    if device == "auto" and recipe is not None:
        cfg = load(recipe, overrides).recipe.runtime
    try:
        return resolve_runtime(cfg)
    except RuntimeUnavailable as e:
        raise BadInput(f"{'--device' if device != 'auto' else e.field}: {e}") from None


@guarded
def eval_cmd(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory (HF format, with config.json).", show_default=False),
    suite: Optional[str] = typer.Option(None, "--suite", help="Suite name from the recipe's `eval` block."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", help="Recipe whose `eval` block defines --suite."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated tasks instead of a suite: local ones by name or tag (world, world_lookup), a standard lm-eval task on your files as NAME@FOLDER (gsm8k@data/gsm8k), chat:NAME@FOLDER through the model's chat template."),
    rows: Optional[Path] = typer.Option(None, "--rows", help="Task rows instead of lm-eval tasks (NeMo Gym-style JSONL, parquet or a datasets folder, each row naming its `environment`): pass@1 and greedy accuracy per domain, as the RL stage scores its held-out rows.", show_default=False),
    samples: int = typer.Option(8, "--samples", min=1, help="With --rows: responses per prompt for pass@1."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", min=1, help="With --rows: the longest response."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="With --rows: the sampling temperature of pass@1 (greedy is always 0)."),
    environment: Optional[str] = typer.Option(None, "--environment", help="With --rows: the verifier for every row (exact_answer, json_answer, calculator, sorting, uppercase), over any row's own."),
    reasoning: bool = typer.Option(False, "--reasoning/--no-reasoning", help="With --rows: prompts with the template's reasoning switch on or off."),
    seed: int = typer.Option(0, "--seed", help="With --rows: the sampling seed."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="At most N items per task, or N rows taken round-robin over their domains (a quick look)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Sequences per forward pass."),
    engine: str = typer.Option("hf", "--engine", help="hf: transformers in this process; vllm: a vLLM server started on the checkpoint for the run (STAGEWISE_VLLM_PYTHON; lm-eval's local-completions model), --tasks and --suite only."),
    device: str = typer.Option("auto", "--device", help="auto (the recipe's runtime.device with --recipe, else cuda when present, else cpu), cpu or cuda."),
    overrides: list[str] = SetOpt,
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Score a checkpoint on lm-eval benchmarks: a suite from a recipe, or tasks by name.

    Local tasks about the demo world (world_arithmetic, world_lookup, ..., tag `world`)
    run offline. A standard lm-eval task runs on files you have, never the hub: NAME@FOLDER
    with one file per split (test.jsonl, train.parquet, ...); a missing file or column
    exits 2 naming what to provide. chat:NAME@FOLDER renders through the model's template.

    --rows FILE scores the checkpoint on task rows the way the RL stage scores its held-out
    rows: pass@1 (mean verifier result over --samples responses per prompt) and greedy
    accuracy, per domain (a row's `domain`, else the file's name) and over all prompts.

    \b
    Example:
      stagewise eval runs/tiny/stages/pretrain-*/step-00000360 --suite chat --recipe recipes/tiny.yaml --limit 20
      stagewise eval runs/tiny/stages/pretrain-*/step-00000360 --tasks world --json
      stagewise eval runs/tiny/stages/rl-*/step-00000160 --tasks world --engine vllm
      stagewise eval CKPT --tasks gsm8k@evaldata/gsm8k,arc_easy@evaldata/arc_easy --limit 50
      stagewise eval runs/tiny/stages/rl-*/step-00000160 --rows runs/tiny/rl_world/*/rl_eval.jsonl --samples 8
    """
    from stagewise.model.checkpoint_check import check_checkpoint

    if engine not in ("hf", "vllm"):
        raise BadInput(f"--engine must be hf or vllm, got {engine!r}")
    if rows is not None:
        if engine != "hf":
            raise BadInput("--rows scores with transformers in this process: leave --engine at hf")
        if suite is not None or tasks is not None:
            raise BadInput("--rows scores task rows: give it without --suite or --tasks")
        check_checkpoint(checkpoint, tokenizer=True)
        return _eval_rows(checkpoint, rows, samples=samples, max_new_tokens=max_new_tokens, temperature=temperature,
                          seed=seed, reasoning=reasoning, environment=environment, limit=limit,
                          device=_runtime(device, recipe, overrides).device, as_json=as_json)
    names = _eval_tasks(suite, recipe, tasks, overrides)
    check_checkpoint(checkpoint, tokenizer=True)
    from stagewise.eval.harness import UnknownTaskError, run_checkpoint, task_manager

    try:
        task_manager(names)  # a typo exits 2 before the model loads
    except UnknownTaskError as e:
        raise BadInput(str(e)) from e
    runtime = _runtime(device, recipe, overrides)
    if engine == "vllm":
        result = _on_vllm(checkpoint, names, limit, batch_size)
    else:
        result = run_checkpoint(checkpoint, names, limit=limit, batch_size=batch_size, device=runtime.device)
    report = {"checkpoint": str(checkpoint), "tasks": names, "limit": limit, "engine": engine,
              "runtime": runtime.model_dump(), "metrics": result.metrics}

    def text() -> None:
        typer.echo(f"{checkpoint}  ({', '.join(names)}{f', limit {limit}' if limit else ''})")
        width = max((len(k) for k in result.metrics), default=0)
        for key, value in result.metrics.items():
            typer.echo(f"  {key:<{width}}  {value:.4f}")

    emit(report, as_json, text)


def _on_vllm(checkpoint: Path, names: list[str], limit: int | None, batch_size: int):
    """The suite through a vLLM server started on `checkpoint` for this run (model/vllm_server.py), then stopped."""
    import json

    from stagewise.eval.harness import run_tasks_on_server
    from stagewise.model.vllm_server import VLLMServer, vllm_python

    try:
        python = vllm_python()
    except RuntimeError as err:
        raise BadInput(f"--engine vllm: {err}") from None
    longest = int(json.loads((checkpoint / "config.json").read_text()).get("max_position_embeddings") or 2048)
    typer.echo(f"starting vLLM on {checkpoint} ...", err=True)
    with VLLMServer(checkpoint, python=python, weight_reload=False, served_name="model", dtype="auto") as server:
        return run_tasks_on_server(server.url, "model", checkpoint, names, limit=limit, batch_size=batch_size,
                                   max_length=min(longest, 4096))


def _eval_rows(checkpoint: Path, rows: Path, *, as_json: bool, **settings) -> None:
    """`eval --rows`: eval/score_rows.py's scores, as a table of domains or as JSON."""
    from stagewise.eval.score_rows import score_rows

    if not rows.exists():
        raise BadInput(f"--rows: {rows}: no such file or directory")
    scores = score_rows(checkpoint, rows, **settings)
    report = {"checkpoint": str(checkpoint), "rows": str(rows), **{k: settings[k] for k in (
        "samples", "max_new_tokens", "temperature", "seed", "reasoning", "environment", "limit")}, **scores}

    def text() -> None:
        typer.echo(f"{checkpoint}  ({rows}: pass@1 over {settings['samples']} samples at temperature "
                   f"{settings['temperature']:g}, greedy)")
        domains = [*scores["prompts"], "all"]
        width = max(len(d) for d in domains)
        typer.echo(f"  {'domain':<{width}}  prompts  pass@1  (95% interval)   greedy")
        for d in domains:
            n = scores["prompts"][d] if d != "all" else sum(scores["prompts"].values())
            low, high = scores["pass_at_1_interval"][d]
            typer.echo(f"  {d:<{width}}  {n:>7}  {scores['pass_at_1'][d]:.4f}  ({low:.3f}-{high:.3f})  "
                       f"{scores['greedy'][d]:.4f}")

    emit(report, as_json, text)


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
    from stagewise.eval.cutoffs import run_cutoff
    from stagewise.eval.gates import UnknownMetricError, check_metrics

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
    from stagewise.eval.plots import cutoff_plot

    runs = {f"{r['run_name']} {r['run_id'][:6]}": r["_histories"] for r in reports if "_histories" in r}
    cuts = {f"{r['run_name']} {r['run_id'][:6]}": (r["cutoff"] or {}).get("tokens_seen") for r in reports if "_histories" in r}
    thresholds: dict[str, list[float]] = {}
    for _, c in rule.conditions():
        if not c.relative:
            thresholds.setdefault(c.series, []).append(c.value)
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


@guarded
def cutoffs_cmd(
    experiment: str = ExperimentOpt,
    stage: str = typer.Option(..., "--stage", help="Stage whose runs to replay, e.g. pretrain."),
    rule: Path = RuleOpt,
    tracking_uri: Optional[str] = TrackingUriOpt,
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of the rule's metrics over tokens with each cutoff marked."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    """Replay a gate rule on a stage's finished runs: where it first held, and what the guards did after.

    \b
    Example:
      stagewise cutoffs --experiment tiny --stage pretrain --rule rule.yaml \
        --tracking-uri sqlite:///runs/tiny/mlflow.db --plot cutoffs.png
    with rule.yaml holding e.g.  all: [{metric: eval/validation/loss, op: "<", value: 3.5}]
    """
    from stagewise.eval.cutoffs import load_rule
    from stagewise.store.tracking import Tracker

    if not rule.is_file():
        raise BadInput(f"rule file not found: {rule}")
    parsed = load_rule(rule)  # names the file, line and field of a bad rule (exit 2)
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

    emit(result, as_json, text)
