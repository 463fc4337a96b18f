"""The data step past one machine: a recipe's sources as Megatron indexed shards, with an MLflow run of its own.

Run from the Prefect UI (the `data-build` deployment, deployments/catalog.py) or as a flow: it reads the
recipe (with `--set`-style overrides, e.g. `data.build.executor=ray`, where the server's form policy opens
them), builds the corpus through tasks/corpus.py (data/corpus/: plan -> filter -> exact and near dedup ->
tokenize -> write, in process or on Ray) into `<workdir>/corpus` and logs the build to an MLflow run `data-build` in the
recipe's experiment, tagged with the plan's digest: docs/s, tokens/s, seconds per phase, per source
tokens, rejects by reason and duplicates removed, and corpus.json / build_report.json as artifacts.
Rerun after a crash, it redoes only unfinished work units. `stagewise data build`
runs the same build with no Prefect or MLflow around it (a batch job's command).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from prefect import flow

from stagewise.flows.pipeline import tracker_for
from stagewise.recipe import load_recipe
from stagewise.recipe.form_policy import form_policy
from stagewise.store.policy import run_logger
from stagewise.store.tracking import STAGE_TAG
from stagewise.tasks.corpus import corpus_build_task

RUN_NAME = "data-build"


@flow(name="data-build", validate_parameters=False)
def data_build_flow(recipe: str, overrides: Optional[list[str]] = None) -> dict:
    """Build `recipe`'s corpus into <workdir>/corpus and log it to an MLflow run `data-build`."""
    policy = form_policy()  # the operator's boundary (stagewise serve), before anything is read
    path = policy.admit_file(recipe, "recipe")
    policy.admit_overrides(overrides or [])
    loaded = load_recipe(path, list(overrides or []))
    r = loaded.recipe
    workdir = Path(r.workdir).resolve()
    tracker = tracker_for(r, workdir)
    with tracker.run(RUN_NAME, {STAGE_TAG: RUN_NAME}) as run_id:
        built = corpus_build_task(r.data, r.tokenizer, str(workdir), r.seed, str(loaded.base_dir),
                                  None, tracker, run_id)
        tracker.set_tags(run_id, {"stagewise.corpus": built["out"],
                                  "stagewise.corpus_plan_sha256": built["manifest"]["plan_sha256"]})
    run_logger().info("data-build: corpus at %s (MLflow run %s)", built["out"], run_id)
    return {"run_id": run_id, **built}
