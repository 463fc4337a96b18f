"""A stage on our engine run as one job where its compute is: local, Slurm or Kubernetes, from the same recipe.

A stage block with a `launch` (and `engine: torch`, the default; merge and quantize have no other) does
not run in the pipeline's process. The pipeline

1. records the stage's inputs — its block, what earlier stages handed it, the pipeline's context
   (workdir, seed, recipe hash, the MLflow store and parent run, --resume) and the recipe's runtime
   settings — as `<workdir>/launch/<stage>-<hash>/inputs.json`, the hash naming those inputs (not
   --resume: a resumed run reaches the same directory);
2. claims that directory's lease (store/leases.py) and submits one job running
   `python -m stagewise.flows.stage_job INPUTS` in `launch.env` (our venv on the nodes, or an image),
   on `launch.nodes` nodes with `launch.gpus_per_node` GPUs (0: a CPU job), followed to its end
   (engines/launch/scheduler_job.py: log streamed into this task's log, the scheduler's state decides,
   the job id recorded in the directory, cancelled when the run is interrupted or taken over);
3. reads back the job's `result.json`: the same StageResult the stage returns in process.

In the job, `main` rebuilds the context (its runtime resolved there, on the node's own devices) and runs
the stage's flow as it would run in process: the same content-addressed step directory and its lease,
the same MLflow run nested under the pipeline's, the same checkpoints (bit for bit: the same code and
seeds), reused when finished. Its flow run reports to the Prefect API the pipeline's run uses
(PREFECT_API_URL is handed over: a real server must be reachable from the nodes; docs/DEPLOY.md).

After a SIGKILL of the pipeline the job runs on, holding the step's lease: a later run that reaches
the stage takes over the launch directory's lease, cancels the recorded job, waits for its end, and
submits its own, which continues from the last checkpoint with --resume; two jobs never build one step.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

from prefect.context import FlowRunContext

from stagewise.data.content_hash import step_hash
from stagewise.engines.config import LaunchConfig
from stagewise.engines.launch.plans import job_name, plan_launch
from stagewise.engines.launch.task import launch_task
from stagewise.flows.stage import Stage, StageContext, Upstream
from stagewise.model.runtime import RuntimeConfig, resolve_runtime
from stagewise.refs import StageResult
from stagewise.store.leases import release
from stagewise.store.steps import claim_step
from stagewise.store.tracking import Tracker

JOB_MODULE = "stagewise.flows.stage_job"
INPUTS, RESULT = "inputs.json", "result.json"


def stage_launch(recipe, name: str) -> LaunchConfig | None:
    """The `launch` of stage `name` when it runs on our engine as a job; None when it runs in process
    (no launch) or its launch belongs to a launched engine (megatron, nemo_rl: the stage drives it)."""
    block = getattr(recipe.stages, name, None)
    launch = getattr(block, "launch", None)
    return launch if launch is not None and getattr(block, "engine", "torch") == "torch" else None


def job_inputs(entry: Stage, ctx: StageContext, block, upstream: Upstream, runtime: RuntimeConfig) -> dict:
    """What the job needs to run `entry` as the pipeline would, as plain JSON."""
    return {
        "stage": entry.name,
        "block_type": f"{type(block).__module__}:{type(block).__qualname__}",
        "block": block.model_dump(mode="json", by_alias=True),
        "upstream": upstream.model_dump(mode="json"),
        "runtime": runtime.model_dump(mode="json"),
        "context": {"workdir": ctx.workdir, "base_dir": ctx.base_dir, "seed": ctx.seed, "recipe_hash": ctx.recipe_hash,
                    "tracker": {"uri": ctx.tracker.uri, "experiment": ctx.tracker.experiment,
                                "artifact_root": ctx.tracker.artifact_root},
                    "parent_run_id": ctx.parent_run_id, "resume": ctx.resume, "run_tags": ctx.run_tags},
    }


def job_dir(ctx: StageContext, inputs: dict) -> Path:
    """`<workdir>/launch/<stage>-<hash of the inputs but --resume>`."""
    named = {**inputs, "context": {k: v for k, v in inputs["context"].items() if k != "resume"}}
    return Path(ctx.workdir) / "launch" / f"{inputs['stage']}-{step_hash('stage-job', named)}"


def run_as_job(entry: Stage, ctx: StageContext, block, upstream: Upstream, launch: LaunchConfig,
               runtime: RuntimeConfig) -> StageResult:
    """Run `entry` as one job (module docstring) and hand back its result."""
    inputs = job_inputs(entry, ctx, block, upstream, runtime)
    where = job_dir(ctx, inputs)
    claim_step(f"{entry.name}-job", where, ctx.parent_run_id)  # a dead holder's job is cancelled here
    try:
        (where / INPUTS).write_text(json.dumps(inputs, indent=1))
        (where / RESULT).unlink(missing_ok=True)
        api = _prefect_api()
        env = {"PREFECT_API_URL": api} if api else {}
        name = f"{entry.name}-job"
        field = f"stages.{entry.name}.launch"
        plan = plan_launch(launch, ["python", "-m", JOB_MODULE, str(where / INPUTS)], where, style="single",
                           name=name, env=env, field=field, job=job_name(name, where, ctx.parent_run_id or ""))
        plan.write_files()
        launch_task(name, plan.argv, plan.cwd, plan.env, str(where / "launch" / f"{name}.log"), ctx.tracker,
                    ctx.parent_run_id, job=plan.job, step_dir=str(where), max_pending_s=launch.slurm.max_pending_s)
        if not (where / RESULT).is_file():
            raise RuntimeError(f"{entry.name}: the job ended without writing {where / RESULT}")
        return StageResult.model_validate_json((where / RESULT).read_text())
    finally:
        release(where)


def _prefect_api() -> str | None:
    """The API this flow run reports to (a temporary server's too), for the job's own flow run."""
    run = FlowRunContext.get()
    url = str(run.client.api_url) if run is not None else os.environ.get("PREFECT_API_URL")
    return url.rstrip("/") if url else None


def run_inputs(path: Path) -> StageResult:
    """Run the stage `path` (an INPUTS file) describes, in this process, and write its RESULT beside it."""
    from stagewise.flows.registry import registered  # noqa: PLC0415 - the registry imports every stage flow

    inputs = json.loads(path.read_text())
    module, _, qualname = inputs["block_type"].partition(":")
    block_type = importlib.import_module(module)
    for part in qualname.split("."):
        block_type = getattr(block_type, part)
    c = inputs["context"]
    ctx = StageContext(workdir=c["workdir"], base_dir=c["base_dir"], seed=c["seed"], recipe_hash=c["recipe_hash"],
                       tracker=Tracker(**c["tracker"]), parent_run_id=c["parent_run_id"], resume=c["resume"],
                       runtime=resolve_runtime(RuntimeConfig.model_validate(inputs["runtime"])), run_tags=c["run_tags"])
    result = registered(inputs["stage"]).flow(ctx, block_type.model_validate(inputs["block"]),
                                              Upstream.model_validate(inputs["upstream"]))
    tmp = path.with_name(f"{RESULT}.tmp-{os.getpid()}")
    tmp.write_text(result.model_dump_json(indent=1))
    os.replace(tmp, path.with_name(RESULT))
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(f"usage: python -m {JOB_MODULE} INPUTS (written by the pipeline: flows/stage_job.py)", file=sys.stderr)
        return 2
    result = run_inputs(Path(argv[0]))
    print(f"{result.stage}: hands on {result.checkpoint}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
