"""The whole recipe as one Prefect flow: a table of contents of the stages, in order.

    pipeline_flow
      ├─ pretrain        (flows/pretrain.py: prepare data -> phases -> validation)
      ├─ merge           (flows/merge.py: windows merged at every checkpoint -> best kept)
      ├─ long_context    (flows/long_context.py: doc-QA + retrieval + phase-2, long/short mix)
      ├─ sft             (flows/sft.py: curate -> blend + pack -> sub-stages -> base vs fine-tuned)
      └─ ... later stages hand each other a StageResult (checkpoint, run id, gate, metrics)

One MLflow parent run per pipeline run (tagged with the Prefect flow-run id), one nested
run per stage. `run_pipeline` is what `stagewise run` calls.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.long_context import long_context_flow
from flows.merge import merge_flow
from flows.pretrain import pretrain_flow
from flows.recipe import STAGE_ORDER, LoadedRecipe, Recipe, RecipeError, flatten_recipe, recipe_hash, select_stages
from flows.sft import NO_START, sft_flow, start_checkpoint
from tasks.refs import StageResult
from tasks.tracking import FLOW_RUN_TAG, RECIPE_TAG, Tracker, default_tracking_uri

def tracker_for(recipe: Recipe, workdir: Path) -> Tracker:
    """The recipe's MLflow store: tracking.uri, or SQLite under the workdir."""
    uri = recipe.tracking.uri or default_tracking_uri(workdir)
    return Tracker(uri=uri, experiment=recipe.tracking.experiment or recipe.name, artifact_root=str(workdir / "mlartifacts"))


@flow(name="stagewise-pipeline", log_prints=True)
def pipeline_flow(
    recipe: Recipe, base_dir: str, stages: list[str] | None = None, resume: bool = False
) -> list[StageResult]:
    """Run the selected stages of `recipe`, each handing its checkpoint to the next."""
    logger = get_run_logger()
    workdir = Path(recipe.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    tracker = tracker_for(recipe, workdir)
    selected = select_stages(recipe, stages) or [s for s in STAGE_ORDER if getattr(recipe.stages, s, None) is not None]
    digest = recipe_hash(recipe)
    tags = {RECIPE_TAG: recipe.name, FLOW_RUN_TAG: str(flow_run.id), "stagewise.recipe_hash": digest}
    with tracker.run(recipe.name, tags) as parent:
        tracker.log_params(parent, flatten_recipe(recipe))
        tracker.log_text(parent, yaml.safe_dump(recipe.model_dump(mode="json", by_alias=True), sort_keys=False), "recipe.yaml")
        logger.info("MLflow: %s (experiment %s, run %s)", tracker.uri, tracker.experiment, parent)
        results: list[StageResult] = []
        if "pretrain" in selected:
            results.append(pretrain_flow(
                recipe.model, recipe.data, recipe.tokenizer, recipe.stages.pretrain, recipe.eval, str(workdir), base_dir,
                recipe.seed, digest, tracker, parent_run_id=parent, resume=resume,
            ))
        if "merge" in selected:
            results.append(merge_flow(
                recipe.stages.merge, results[-1], recipe.stages.pretrain.seq_length, str(workdir), recipe.seed, digest,
                tracker, parent_run_id=parent, suites=recipe.eval,
            ))
        if "long_context" in selected:
            results.append(long_context_flow(
                recipe.stages.long_context, results[-1], recipe.stages.pretrain.phases[-1].blend, recipe.model,
                str(workdir), recipe.seed, digest, tracker, parent_run_id=parent, resume=resume,
            ))
        if "sft" in selected:
            results.append(sft_flow(
                recipe.stages.sft, recipe.model, start_checkpoint(results, recipe.model.from_), recipe.eval,
                str(workdir), base_dir, recipe.seed, digest, tracker, parent_run_id=parent, resume=resume,
                world_entities=recipe.data.world.facts if recipe.data.world else 3000,
            ))
        tracker.log_json(parent, [r.model_dump() for r in results], "stage_results.json")
    return results


def check_starts(recipe: Recipe, chosen: list[str]) -> None:
    """RecipeError (exit 2) when a selected stage has no checkpoint to start from."""
    for stage in ("merge", "long_context"):
        if stage in chosen and "pretrain" not in chosen:
            raise RecipeError([f"--stages {','.join(chosen)}: {stage} needs pretrain in the same run (a finished, "
                               "unchanged pretraining stage is reused without training)"])
    if "sft" not in chosen or any(STAGE_ORDER.index(s) < STAGE_ORDER.index("sft") for s in chosen):
        return
    if recipe.model.from_ is None:
        raise RecipeError([f"--stages {','.join(chosen)}: {NO_START}"])
    if not (Path(recipe.model.from_) / "config.json").is_file():
        raise RecipeError([f"model.from: {recipe.model.from_} is not a checkpoint directory (no config.json)"])


def run_pipeline(loaded: LoadedRecipe, stages: list[str] | None = None, resume: bool = False) -> dict:
    """Validate the stage selection, run the flow, and summarise where everything went."""
    chosen = select_stages(loaded.recipe, stages) or [s for s in STAGE_ORDER if getattr(loaded.recipe.stages, s, None) is not None]
    check_starts(loaded.recipe, chosen)  # bad input fails before Prefect starts
    results = pipeline_flow(loaded.recipe, str(loaded.path.parent.resolve()), stages, resume)
    workdir = Path(loaded.recipe.workdir).resolve()
    tracker = tracker_for(loaded.recipe, workdir)
    return {
        "recipe": loaded.recipe.name,
        "workdir": str(workdir),
        "tracking_uri": tracker.uri,
        "experiment": tracker.experiment,
        "stages": [r.model_dump() for r in results],
    }
