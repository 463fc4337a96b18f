"""The flow the Prefect deployments run: a recipe path plus small typed parameters, checked first.

`stagewise run` takes a recipe file, `--stages`, `--set` and `--resume`; a deployment triggered
from the Prefect UI (or a schedule) takes the same four things as flow parameters, typed so the
UI renders a form: the recipe path (str), the stages (a multi-select of the stages this version
can run), the overrides (`key=value` strings, exactly what `--set` takes) and resume (bool).

The flow checks its parameters before any work, with the same code and the same located
message as the CLI (`<yaml.path>: <why> (<file>:<line>)`): a bad override, a stage the recipe
lacks or a selection that cannot start raises BadInput, so the flow run ends Failed with that
message and nothing is trained or written under the workdir. Before that, the operator's boundary
(recipe/form_policy.py): a recipe outside the served roots, or an override key the server does
not open to forms, fails the flow run the same way, naming the parameter and the key. Prefect's own parameter
validation is off (`validate_parameters=False`) so the located message, not a pydantic dump,
is what a person reads; the server still refuses values outside the form's schema when a
deployment enforces it.

A relative recipe path is read from the directory `stagewise serve` was started in (the
runner starts each flow run there).
"""

from pathlib import Path
from typing import Literal, Optional

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from stagewise.data.errors import BadInput
from stagewise.eval.ablation import render_text
from stagewise.flows.ablate import run_ablation
from stagewise.flows.ablate_plan import ablatable, plan_ablation
from stagewise.flows.pipeline import publish_closing_table, tracker_for
from stagewise.recipe import LoadedRecipe, available_stages, load_recipe, select_stages
from stagewise.recipe.doctor import diagnose, failing
from stagewise.recipe.form_policy import form_policy
from stagewise.recipe.shipped import resolve_recipe
from stagewise.store.policy import run_logger

StageName = Literal[tuple(available_stages())]  # type: ignore[valid-type]  # the UI's multi-select
"""The stages this version can run, as the form's choices."""


def check_request(recipe: str, stages: Optional[list[str]], overrides: Optional[list[str]]) -> tuple[LoadedRecipe, Optional[list[str]]]:
    """The loaded recipe and the stage selection in pipeline order; BadInput (located) when unusable.

    What `stagewise run` checks before Prefect starts: the recipe with its overrides, then
    the stage names against the recipe.
    """
    loaded = load_recipe(resolve_recipe(recipe), list(overrides or []))
    return loaded, (select_stages(loaded.recipe, list(stages)) if stages else None)


@flow(name="stagewise-recipe", validate_parameters=False, log_prints=False)
def run_recipe_flow(
    recipe: str,
    stages: Optional[list[StageName]] = None,  # type: ignore[valid-type]
    overrides: Optional[list[str]] = None,
    resume: bool = False,
    force: bool = False,
) -> dict:
    """Run a recipe's stages (all of them when `stages` is empty) as `stagewise run` does.

    `overrides` are `--set` values, e.g. `stages.pretrain.tokens=491520`; `resume` continues each
    stage from its latest checkpoint; `force` runs even when the recipe doctor finds errors (as
    `stagewise run --force`: its errors fail the flow run before any work, its warnings are logged).
    Returns the run's summary (the `stagewise run --json` document); this flow run and the pipeline's
    carry the closing table and the MLflow link as artifacts, each stage's flow run its row
    (flows/pipeline.py).
    """
    from stagewise.flows.pipeline import run_pipeline  # noqa: PLC0415 (a deployed run checks its form before the stages (torch) load; the stages (torch) load only once the input is good)

    policy = form_policy()  # the operator's boundary (stagewise serve), before anything is read
    recipe = str(policy.admit_file(recipe, "recipe"))
    policy.admit_overrides(overrides or [])
    loaded, chosen = check_request(recipe, stages, overrides)
    logger = run_logger()
    findings = diagnose(loaded, chosen)
    errors = failing(findings)
    for finding in findings:
        if finding not in errors or force:
            logger.warning("recipe doctor: %s", finding.line())
    if errors and not force:
        raise BadInput([f.line() for f in errors], title="the recipe doctor found errors (run with force to run anyway)")
    logger.info("recipe %s (%s), stages %s, overrides %s, resume %s", loaded.path, loaded.recipe.name,
                ",".join(chosen) if chosen else "all", list(overrides or []) or "none", resume)
    summary = run_pipeline(loaded, stages=chosen, resume=resume)

    # the page the Run button opens is this flow run's, not the pipeline subflow's: the table there too
    publish_closing_table(loaded.recipe.name, summary["stages"], tracker_for(loaded.recipe, Path(summary["workdir"])),
                          summary["mlflow_run_id"], summary["workdir"])
    logger.info("done: workdir %s; MLflow %s (experiment %s)", summary["workdir"], summary["tracking_uri"], summary["experiment"])
    return summary


AblatableStage = Literal[tuple(ablatable())]  # type: ignore[valid-type]
"""The stages an ablation can run alone (those that read no other stage's result), as the form's choices."""


@flow(name="stagewise-ablation", validate_parameters=False, log_prints=False)
def ablate_recipe_flow(
    recipe: str,
    stage: AblatableStage,  # type: ignore[valid-type]
    variants: list[str],
    budget: float = 0.25,
    start: Optional[str] = None,
    parallel: int = 1,
    overrides: Optional[list[str]] = None,
) -> dict:
    """An ablation as `stagewise ablate` runs it: `variants` are `NAME` or `NAME:KEY=VALUE` strings
    (a name repeated gathers its overrides), `budget` the fraction of the stage's budget each trains,
    `start` the checkpoint every variant starts from (default: model.from). Every variant is checked
    (overrides and the recipe doctor) before any work; the comparison is the run's artifact in the UI."""

    policy = form_policy()  # the operator's boundary (stagewise serve), before anything is read
    recipe = str(policy.admit_file(recipe, "recipe"))
    policy.admit_overrides(overrides or [])
    policy.admit_overrides([v.partition(":")[2] for v in variants if v.partition(":")[2].strip()], "variants")
    if start is not None:
        policy.admit_overrides([f"model.from={start}"], "start")
    plan = plan_ablation(recipe, stage, list(variants), list(overrides or []), budget, start)
    for v in plan.variants:
        errors = failing(diagnose(plan.loaded[v.name], [stage]))
        if errors:
            raise BadInput([f"--variant {v.name}: {f.line()}" for f in errors], title="the recipe doctor found errors")
    result = run_ablation(plan, parallel)
    create_markdown_artifact(key="stagewise-ablation", description=f"ablation of {stage}",
                             markdown=f"```\n{render_text(result['comparison'])}\n```\n\nMLflow run `{result['run_id']}`.")
    return result
