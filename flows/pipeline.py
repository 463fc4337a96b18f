"""The whole recipe as one Prefect flow: a table of contents of the stages, in order.

    pipeline_flow
      ├─ pretrain        (flows/pretrain.py: prepare data -> phases -> validation)
      ├─ merge           (flows/merge.py: windows merged at every checkpoint -> best kept)
      ├─ long_context    (flows/long_context.py: doc-QA + retrieval + phase-2, long/short mix)
      ├─ sft             (flows/sft.py: curate -> blend + pack -> sub-stages -> base vs fine-tuned)
      ├─ rl              (flows/rl.py: rows -> difficulty profile -> GRPO -> held-out pass@1)
      ├─ distill         (flows/distill.py: teachers per domain -> on-policy distillation -> pass@1)
      └─ quantize        (flows/quantize.py: sensitivities -> per-operator formats -> export, rescored)

The stages come from flows/registry.py (tests/flows/test_registry.py checks this list against it); each is called the same way, `flow(ctx, block,
upstream)` (flows/stage.py), and hands the next a StageResult; a stage on our engine with a `launch`
runs as one job instead, which calls its flow the same way where its compute is (flows/stage_job.py). One MLflow parent run per
pipeline run (tagged with the Prefect flow-run id), one nested run per stage, and the
closing table (flows/closing_table.py) as the parent run's report. `run_pipeline` is what
`stagewise run` calls; it checks the stage selection and the runtime before Prefect starts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import yaml
from prefect import flow, get_run_logger
from prefect.artifacts import MarkdownArtifact, create_link_artifact, create_markdown_artifact
from prefect.runtime import flow_run
from prefect.utilities.engine import get_state_for_result

from stagewise.engines.availability import EngineMissing, check_engine
from stagewise.flows.closing_table import closing_rows, describe_parent_run, log_closing_table, markdown_table
from stagewise.flows.registry import REGISTRY
from stagewise.flows.stage import NO_START, Stage, StageContext, Upstream
from stagewise.flows.stage_job import run_as_job, stage_launch
from stagewise.model.runtime import Runtime, RuntimeUnavailable, resolve_runtime
from stagewise.recipe import LoadedRecipe, Recipe, RecipeError, flatten_recipe, recipe_hash, select_stages
from stagewise.recipe.errors import cite_location, locate
from stagewise.refs import StageResult
from stagewise.store.tracking import FLOW_RUN_TAG, RECIPE_TAG, Tracker, default_tracking_uri


def tracker_for(recipe: Recipe, workdir: Path) -> Tracker:
    """The recipe's MLflow store: tracking.uri, or SQLite under the workdir."""
    uri = recipe.tracking.uri or default_tracking_uri(workdir)
    return Tracker(uri=uri, experiment=recipe.tracking.experiment or recipe.name, artifact_root=str(workdir / "mlartifacts"))


def chosen_stages(recipe: Recipe, stages: list[str] | None) -> list[Stage]:
    """The registry entries to run: those named (in pipeline order), else every stage the recipe has."""
    names = select_stages(recipe, stages) if stages else None
    return [s for s in REGISTRY if (s.name in names if names else s.select(recipe) is not None)]


@flow(name="stagewise-pipeline")
def pipeline_flow(
    recipe: Recipe, base_dir: str, stages: list[str] | None = None, resume: bool = False,
    runtime: Runtime | None = None,
) -> list[StageResult]:
    """Run the selected stages of `recipe`, each handing its checkpoint to the next."""
    logger = get_run_logger()
    runtime = runtime or resolve_runtime(recipe.runtime)
    workdir = Path(recipe.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    tracker = tracker_for(recipe, workdir)
    digest = recipe_hash(recipe)
    tags = {RECIPE_TAG: recipe.name, FLOW_RUN_TAG: str(flow_run.id), "stagewise.recipe_hash": digest}
    with tracker.run(recipe.name, tags) as parent:
        tracker.log_params(parent, flatten_recipe(recipe) | runtime.params())
        tracker.log_text(parent, yaml.safe_dump(recipe.model_dump(mode="json", by_alias=True), sort_keys=False), "recipe.yaml")
        logger.info("MLflow: %s (experiment %s, run %s); runtime %s/%s; Mamba kernels: %s",
                    tracker.uri, tracker.experiment, parent, runtime.device, runtime.precision, runtime.mamba_kernels)
        ctx = StageContext(workdir=str(workdir), base_dir=base_dir, seed=recipe.seed, recipe_hash=digest,
                           tracker=tracker, parent_run_id=parent, resume=resume, runtime=runtime)
        upstream = Upstream()
        for entry in chosen_stages(recipe, stages):
            started = time.monotonic()
            block = entry.select(recipe)
            given = upstream.read_by(entry, block)  # the object Prefect links its edges by
            launch = stage_launch(recipe, entry.name)
            result = (run_as_job(entry, ctx, block, given, launch, recipe.runtime) if launch is not None
                      else entry.flow(ctx, block, given))
            if result.summary is not None:  # a reused stage: what it cost when it was trained
                trained_in = result.trained_in_run if result.reused else None
                result.summary.seconds = ((tracker.run_seconds(trained_in) if trained_in else None)
                                          or round(time.monotonic() - started, 1))
            publish_stage_row(result, stage_flow_run(result), tracker)
            upstream = Upstream(results=[*upstream.results, result])
        tracker.log_json(parent, [r.model_dump() for r in upstream.results], "stage_results.json")
        log_closing_table(tracker, parent, upstream.results, workdir)
        describe_parent_run(tracker, parent, closing_rows(upstream.results))
        publish_closing_table(recipe.name, closing_rows(upstream.results), tracker, parent, workdir)
    return upstream.results


def stage_flow_run(result: StageResult) -> str | None:
    """The flow run a stage's result came from (Prefect links every returned object to its run's state)."""
    linked = get_state_for_result(result)
    return str(linked[0].state_details.flow_run_id) if linked else None


def publish_stage_row(result: StageResult, flow_run_id: str | None, tracker: Tracker) -> None:
    """The stage's closing-table row and the link to its MLflow run, as an artifact on its own flow run."""
    MarkdownArtifact(key=f"stagewise-stage-{result.stage.replace('_', '-')}", flow_run_id=flow_run_id,
                     description=f"{result.stage}: its closing-table row",
                     markdown=markdown_table(closing_rows([result]), tracker.ui_url)).create()


def publish_closing_table(name: str, rows: list[dict], tracker: Tracker, parent: str, workdir: Path | str) -> None:
    """The closing table (each MLflow run id a link), where the results are and a link to the pipeline's
    MLflow run, as artifacts on the current flow run's page: the pipeline's (a CLI run, the demo and a
    deployment alike), and a deployment's own run, the page its Run button opens (flows/deployed.py)."""
    url = tracker.ui_url(parent)
    create_markdown_artifact(
        key="stagewise-closing-table", description=f"{name}: one row per stage",
        markdown=(f"{markdown_table(rows, tracker.ui_url)}\n\nWorkdir `{workdir}`; MLflow `{tracker.uri}` "
                  f"(experiment `{tracker.experiment}`): [the pipeline's run]({url})."))
    create_link_artifact(url, link_text=f"MLflow run {parent}", key="stagewise-mlflow-run",
                         description="the pipeline's parent run in the MLflow UI"
                                     + ("" if tracker.uri.startswith(("http://", "https://")) else
                                        f" (after `mlflow ui --backend-store-uri {tracker.uri}`)"))


def check_starts(recipe: Recipe, names: list[str]) -> None:
    """RecipeError (exit 2) when a selected stage (of `names`) lacks what it consumes."""
    chosen = [s for s in REGISTRY if s.name in names]
    for entry in chosen:
        for need in entry.needs:
            if need not in names:
                raise RecipeError([f"--stages {','.join(names)}: {entry.name} needs {need} in the same run (a finished, "
                                   "unchanged pretraining stage is reused without training)"])
    first = chosen[0] if chosen else None
    if first is None or first.start != "handed_on":
        return
    if recipe.model.from_ is None:
        raise RecipeError([f"--stages {','.join(names)}: stages.{first.name} {NO_START}"])
    if not (Path(recipe.model.from_) / "config.json").is_file():
        raise RecipeError([f"model.from: {recipe.model.from_} is not a checkpoint directory (no config.json); "
                           f"stages.{first.name} starts there: point it at one, --set model.from=PATH"])


def runtime_of(loaded: LoadedRecipe) -> Runtime:
    """The recipe's runtime on this machine; RecipeError naming the field (and its line) when unavailable."""
    try:
        return resolve_runtime(loaded.recipe.runtime)
    except RuntimeUnavailable as e:
        where = cite_location(locate(e.field, loaded.sources, str(loaded.path)))
        raise RecipeError([f"{e.field}: {e} ({where})"]) from None


def check_engines(loaded: LoadedRecipe, names: list[str]) -> None:
    """Every launched engine of the chosen stages can be launched here (its venv holds the engine, the
    scheduler's tool is on PATH); RecipeError naming the field, its line, and how to get the engine."""
    problems = []
    for name in names:
        block = getattr(loaded.recipe.stages, name, None)
        if getattr(block, "launch", None) is None:
            continue
        try:
            check_engine(getattr(block, "engine", "torch"), block.launch, field=f"stages.{name}.launch")
        except EngineMissing as e:
            where = cite_location(locate(e.field, loaded.sources, str(loaded.path)))
            problems.append(f"{e.field}: {e.message} ({where})")
    if problems:
        raise RecipeError(problems)


def run_pipeline(loaded: LoadedRecipe, stages: list[str] | None = None, resume: bool = False,
                 on_start: Callable[[], object] | None = None) -> dict:
    """Validate the stage selection, runtime and engines, call `on_start` (the CLI opens its run log
    there: a refused run writes nothing), run the flow, and summarise where everything went."""
    chosen = chosen_stages(loaded.recipe, stages)
    check_starts(loaded.recipe, [s.name for s in chosen])  # bad input fails before Prefect starts
    runtime = runtime_of(loaded)
    check_engines(loaded, [s.name for s in chosen])
    if on_start is not None:
        on_start()
    state = pipeline_flow(loaded.recipe, str(loaded.path.parent.resolve()), stages, resume, runtime, return_state=True)
    results = state.result()
    workdir = Path(loaded.recipe.workdir).resolve()
    tracker = tracker_for(loaded.recipe, workdir)
    flow_run_id = str(state.state_details.flow_run_id)
    parent = tracker.client().search_runs([tracker.experiment_id()], f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}'",
                                          max_results=1)[0].info.run_id
    return {
        "recipe": loaded.recipe.name,
        "workdir": str(workdir),
        "tracking_uri": tracker.uri,
        "experiment": tracker.experiment,
        "mlflow_run_id": parent,
        "mlflow_run_url": tracker.ui_url(parent),
        "prefect_flow_run_id": flow_run_id,
        "runtime": runtime.model_dump(),
        "stages": [row | r.model_dump(exclude={"summary"}) for row, r in zip(closing_rows(results), results)],
    }

