"""The nightly evaluation: the newest registered checkpoint of a recipe, scored on its eval suites.

Scheduled by the `nightly-eval` deployment (deployments/catalog.py) or run from the Prefect UI:
it reads the recipe (with `--set`-style overrides), finds the newest checkpoint the pipeline
registered (the alias of the latest stage that has one: sft, else long_context, merge, pretrain),
and runs each suite of the recipe's `eval` block (or the one named) through the same scorer as
every stage (tasks/evaluate.py suite_task). The scores go to an MLflow run `nightly-eval` tagged
with the version it scored, so a person sees a checkpoint's benchmarks move night by night
without retraining anything. Bad input (recipe, suite, no registered checkpoint yet) fails the
flow run with a located message before any model is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from prefect import flow

from stagewise.data.errors import BadInput
from stagewise.flows.pipeline import runtime_of, tracker_for
from stagewise.flows.registry import REGISTRY
from stagewise.recipe import load_recipe
from stagewise.recipe.errors import did_you_mean
from stagewise.recipe.form_policy import form_policy
from stagewise.refs import CheckpointRef
from stagewise.store.policy import run_logger
from stagewise.store.tracking import STAGE_TAG, Tracker
from stagewise.tasks.evaluate import suite_task

RUN_NAME = "nightly-eval"


def suites_to_run(eval_block: dict[str, list[str]], suite: str | None) -> dict[str, list[str]]:
    """The suites to score: the one named, else every suite of the recipe; BadInput when there is none."""
    if suite is not None:
        if suite not in eval_block:
            raise BadInput(f"suite: the recipe has no eval suite {suite!r}{did_you_mean(suite, eval_block)}; "
                           f"its suites: {', '.join(eval_block) or 'none'}")
        return {suite: eval_block[suite]}
    if not eval_block:
        raise BadInput("eval: the recipe names no eval suites (add an `eval:` block, e.g. chat: [world_lookup])")
    return dict(eval_block)


def newest_checkpoint(tracker: Tracker) -> dict:
    """{stage, version, checkpoint} of the latest stage (pipeline order) with a registered version."""
    for stage in reversed([s.name for s in REGISTRY]):
        found = tracker.registered(tracker.experiment, stage)
        if found is not None:
            return {"stage": stage, **found}
    raise BadInput(f"no registered checkpoint in experiment {tracker.experiment!r} yet: run the recipe first "
                   f"(stagewise run, or the pipeline deployment)")


@flow(name="nightly-eval", validate_parameters=False)
def evaluate_latest_flow(recipe: str, suite: Optional[str] = None, overrides: Optional[list[str]] = None,
                         limit: Optional[int] = None) -> dict:
    """Score the newest registered checkpoint of `recipe` on its eval suites (or `suite`); `limit` items per task."""
    policy = form_policy()  # the operator's boundary (stagewise serve), before anything is read
    path = policy.admit_file(recipe, "recipe")
    policy.admit_overrides(overrides or [])
    loaded = load_recipe(path, list(overrides or []))
    suites = suites_to_run(loaded.recipe.eval, suite)
    runtime = runtime_of(loaded)
    tracker = tracker_for(loaded.recipe, Path(loaded.recipe.workdir).resolve())
    target = newest_checkpoint(tracker)
    ckpt = CheckpointRef(path=target["checkpoint"], step=0, tokens_seen=0)
    tags = {STAGE_TAG: RUN_NAME, "stagewise.evaluated_version": target["version"],
            "stagewise.evaluated_stage": target["stage"], "stagewise.checkpoint": target["checkpoint"]}
    metrics: dict[str, float] = {}
    with tracker.run(RUN_NAME, tags) as run_id:
        for name, tasks in suites.items():
            metrics |= suite_task(ckpt, tasks, limit, tracker, run_id, device=runtime.device)
    run_logger().info("nightly eval of %s version %s (%s): %s", tracker.experiment, target["version"], target["stage"],
                      ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items())))
    return {"run_id": run_id, **target, "metrics": metrics}
