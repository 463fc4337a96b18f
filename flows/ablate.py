"""`ablate`: one stage of a recipe run several times from the same start, then compared.

    ablate_flow
      ├─ variant <name> (first)   the stage's own flow from the common start, its MLflow run nested
      │                           under the ablation's and tagged stagewise.variant; run alone, it
      │                           writes the data steps every variant shares (world, curation)
      ├─ variant <name> ...       the others, `parallel` at a time (Prefect task concurrency)
      └─ comparison               eval/ablation.py: a row per score, a column per variant; kept as
                                  reports/ablation.{json,txt,png} on the ablation's run, and the target
                                  metric per variant as ablation/<variant>/<target>

Each variant is a whole recipe (flows/ablate_plan.py validated them all before this flow
starts), so its steps are content-addressed like any run's: an unchanged variant of an
earlier ablation, or of a full run at the same budget, is reused, not retrained. The first
variant runs alone because concurrent writers of one step directory would race; the steps
that differ between variants (blends, training) have their own directories.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from prefect import flow, task
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from stagewise.eval.ablation import compare, render_text
from stagewise.eval.plots import ablation_plot
from stagewise.eval.splits import is_test_metric
from stagewise.flows.pipeline import runtime_of, tracker_for
from stagewise.flows.registry import registered
from stagewise.flows.stage import StageContext, Upstream
from stagewise.model.runtime import Runtime
from stagewise.recipe import Recipe, recipe_hash
from stagewise.recipe.params import MLFLOW_PARAM_MAX
from stagewise.refs import StageResult
from stagewise.store.policy import once, run_logger
from stagewise.store.tracking import FLOW_RUN_TAG, RECIPE_TAG, Tracker

ABLATION_TAG = "stagewise.ablation"
VARIANT_TAG = "stagewise.variant"


@task(**once("ablate-variant"))
def variant_task(stage: str, variant: str, ctx: StageContext, recipe: Recipe) -> StageResult:
    """One variant: the stage's flow, named `<stage>-<variant>` in Prefect, from the plan's start."""
    entry = registered(stage)
    started = time.monotonic()
    result = entry.flow.with_options(flow_run_name=f"{stage}-{variant}")(ctx, entry.select(recipe), Upstream())
    if result.summary is not None:
        result.summary.seconds = round(time.monotonic() - started, 1)
    return result


def _context(recipe: Recipe, variant: str, base_dir: str, tracker: Tracker, parent: str, runtime: Runtime) -> StageContext:
    return StageContext(workdir=str(Path(recipe.workdir).resolve()), base_dir=base_dir, seed=recipe.seed,
                        recipe_hash=recipe_hash(recipe), tracker=tracker, parent_run_id=parent, runtime=runtime,
                        run_tags={VARIANT_TAG: variant, ABLATION_TAG: parent})


def _run_variants(stage: str, recipes: dict[str, Recipe], contexts: dict[str, StageContext]) -> dict[str, StageResult]:
    """The first variant alone, then the rest concurrently; every variant finishes before a failure is raised."""
    names = list(recipes)
    first = variant_task.with_options(task_run_name=f"variant-{names[0]}").submit(stage, names[0], contexts[names[0]],
                                                                                   recipes[names[0]])
    first.wait()
    if not first.state.is_completed():  # the others would fail the same way on the shared steps
        raise RuntimeError(f"ablation of {stage}: the first variant, {names[0]}, failed: {first.state.message}")
    futures = {names[0]: first} | {n: variant_task.with_options(task_run_name=f"variant-{n}").submit(
        stage, n, contexts[n], recipes[n]) for n in names[1:]}
    for f in futures.values():
        f.wait()
    failed = [n for n, f in futures.items() if not f.state.is_completed()]
    if failed:
        raise RuntimeError(f"ablation of {stage}: variant(s) {', '.join(failed)} failed (the others finished; "
                           "their runs are in MLflow): " + "; ".join(str(futures[n].state.message) for n in failed))
    return {n: f.result() for n, f in futures.items()}


def _report(tracker: Tracker, parent: str, stage: str, results: dict[str, StageResult]) -> dict:
    """The comparison on the ablation's run: JSON, text and chart, and each variant's target metric on
    the dev split where the stage has one (an ablation is tuning: test is for the report only)."""
    summary = next((r.summary for r in results.values() if r.summary is not None), None)
    target = (summary.dev_metric or summary.metric) if summary else None
    table = compare({n: {k: v for k, v in r.metrics.items() if not is_test_metric(k)} for n, r in results.items()},
                    target, summary.higher_is_better if summary else None)
    tracker.log_json(parent, table, "reports/ablation.json")
    tracker.log_text(parent, render_text(table) + "\n", "reports/ablation.txt")
    tracker.log_figure(parent, ablation_plot(table, f"Ablation of {stage}"), "reports/ablation.png")
    if summary is not None:
        tracker.log_metrics(parent, [(0, 0, {f"ablation/{n}/{target}": r.metrics[target]
                                             for n, r in results.items() if target in r.metrics})])
    return table


@flow(name="stagewise-ablate")
def ablate_flow(stage: str, recipes: dict[str, Recipe], overrides: dict[str, list[str]], base_dir: str,
                runtime: Runtime, budget: float, start: str | None = None) -> dict:
    """Run `stage` once per variant recipe under one MLflow parent run, then compare the variants."""
    log = run_logger()

    first = next(iter(recipes.values()))
    tracker = tracker_for(first, Path(first.workdir).resolve())
    tags = {RECIPE_TAG: first.name, FLOW_RUN_TAG: str(flow_run.id), ABLATION_TAG: stage}
    with tracker.run(f"ablate-{stage}", tags) as parent:
        tracker.log_params(parent, {"ablation.stage": stage, "ablation.budget": str(budget),
                                    "ablation.start": start or "",
                                    **{f"ablation.variant.{n}": ("; ".join(o) or "(the recipe)")[:MLFLOW_PARAM_MAX]
                                       for n, o in overrides.items()}})
        log.info("ablation of %s: %d variants (%s) at %g of the budget; MLflow run %s",
                 stage, len(recipes), ", ".join(recipes), budget, parent)
        contexts = {n: _context(r, n, base_dir, tracker, parent, runtime) for n, r in recipes.items()}
        results = _run_variants(stage, recipes, contexts)
        table = _report(tracker, parent, stage, results)
    return {"stage": stage, "run_id": parent, "tracking_uri": tracker.uri, "experiment": tracker.experiment,
            "budget": budget, "start": start, "comparison": table,
            "variants": [{"name": n, "overrides": overrides[n], "run_id": r.run_id, "checkpoint": r.checkpoint,
                          "reused": r.reused, "seconds": r.summary.seconds if r.summary else None,
                          "target": _target(r), "value": r.metrics.get(_target(r)) if _target(r) else None}
                         for n, r in results.items()]}


def _target(result: StageResult) -> str | None:
    """What an ablation compares a variant on: its stage's dev metric, else its target metric."""
    return (result.summary.dev_metric or result.summary.metric) if result.summary else None


def run_ablation(plan, parallel: int = 1, on_start: Callable[[], object] | None = None) -> dict:
    """What `stagewise ablate` calls: the runtime checked first, then `on_start` (the CLI's run log), then
    the flow with `parallel` workers."""

    first = plan.loaded[plan.variants[0].name]
    runtime = runtime_of(first)
    if on_start is not None:
        on_start()
    runner = ablate_flow.with_options(task_runner=ThreadPoolTaskRunner(max_workers=parallel))
    state = runner(plan.stage, {v.name: plan.recipe(v.name) for v in plan.variants},
                   {v.name: list(v.overrides) for v in plan.variants}, str(first.path.parent.resolve()), runtime,
                   plan.budget, plan.start, return_state=True)
    return state.result() | {"prefect_flow_run_id": str(state.state_details.flow_run_id)}
