"""Running a stage's training on a launched engine (Megatron-Bridge, NeMo RL) instead of ours.

The stage flow stays the stage flow: same MLflow run, same content-addressed step directory, same
checkpoint handed on, same closing-table row; only "train" is replaced by a few launches, each one
Prefect task (engines/launch/task.py: output streamed, exit status honoured):

    <engine>-import   our HF checkpoint -> the engine's format (Megatron-Bridge's HF bridge)
    <engine>-train    the training launch(es): torchrun / sbatch / a Kubernetes Job, as `launch` says
    <engine>-export   the engine's last checkpoint -> a Hugging Face directory

and the export is adopted as our checkpoint (model.checkpoint.adopt_checkpoint: stagewise.json,
weight hash, tokenizer), so the next stage — on either engine — reads what it always reads.

The engine logs into the stage's own MLflow run: MLFLOW_TRACKING_URI and MLFLOW_RUN_ID are in its
environment (and the translation sets the engine's MLflow keys where it has them). A local SQLite
store is only reachable by a container because the workdir is mounted at the same path.

Conversions run as one process on one node; training launches get the whole `launch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from stagewise.engines.availability import check_engine, container_tool
from stagewise.engines.config import LaunchConfig, Parallelism
from stagewise.engines.launch.plans import job_name, plan_launch
from stagewise.engines.launch.task import launch_task
from stagewise.model.checkpoint import CheckpointMeta, adopt_checkpoint, read_meta
from stagewise.refs import CheckpointRef
from stagewise.store.tracking import Tracker


class StageRun(Protocol):
    """What a launch reads of the stage that runs it (flows/stage.py's StageContext has it): where its
    MLflow run is, the workdir mounted into containers, and the recipe hash stamped on checkpoints."""

    tracker: Tracker
    workdir: str
    recipe_hash: str


@dataclass(frozen=True)
class EngineStep:
    """One launch of a launched stage."""

    name: str
    """Names its Prefect task's log lines, its log file and its job (e.g. `megatron-train-diversity`)."""
    entry: list[str]
    """One engine process's argv (a leading `python` is the environment's interpreter)."""
    style: Literal["torchrun", "single"] = "single"
    """torchrun: one process per GPU (Megatron-Bridge training); single: one process (conversions, NeMo RL's driver)."""
    one_node: bool = False
    """Run on one node with one GPU, whatever `launch` says (checkpoint conversions)."""


@dataclass(frozen=True)
class EnginePlan:
    """A launched stage's steps and where its Hugging Face export will be."""

    steps: list[EngineStep]
    export_dir: Path
    """Where the last step leaves a Hugging Face checkpoint directory."""
    step: int
    """Optimizer steps the export has trained (for stagewise.json and the MLflow step)."""
    tokens: int
    """Tokens (or, for RL, rollout tokens as far as known; 0 when not) the export has trained."""


def one_node(launch: LaunchConfig) -> LaunchConfig:
    """`launch` on one node with one GPU and no model parallelism (where conversions run)."""
    return launch.model_copy(update={"nodes": 1, "gpus_per_node": 1, "parallel": Parallelism()})


def with_engine(spec: dict, block) -> dict:
    """A stage step's spec with its engine and launch when they are not ours: another engine's
    weights are another step, while torch steps keep the hashes they always had."""
    return spec if block.engine == "torch" else {**spec, "engine": [block.engine, block.launch]}


def engine_env(ctx: StageRun, run_id: str) -> dict[str, str]:
    """What a launched engine needs to log into the stage's MLflow run."""
    return {"MLFLOW_TRACKING_URI": ctx.tracker.uri, "MLFLOW_RUN_ID": run_id,
            "MLFLOW_EXPERIMENT_NAME": ctx.tracker.experiment}


def run_engine(ctx: StageRun, stage: str, engine: str, launch: LaunchConfig, run_id: str, out_dir: Path,
               plan: EnginePlan, parent: str | None, tokenizer_dir: str | None) -> CheckpointRef:
    """Launch every step of `plan` in turn, then adopt its export as `<out_dir>/step-<n>`.

    The engine is checked again here (a deployment's worker may not be the machine that
    validated the recipe); a step that fails raises tasks.launch.LaunchFailed and nothing is
    handed on."""
    field_path = f"stages.{stage}.launch"
    check_engine(engine, launch, field=field_path)
    tool = container_tool() or "docker"
    env = engine_env(ctx, run_id)
    mounts = [f"{Path(ctx.workdir).resolve()}:{Path(ctx.workdir).resolve()}"]
    for step in plan.steps:
        cfg = one_node(launch) if step.one_node else launch
        lp = plan_launch(cfg, step.entry, out_dir, style=step.style, name=step.name, env=env, field=field_path,
                         container_tool=tool, mounts=mounts, job=job_name(step.name, out_dir, run_id))
        lp.write_files()
        launch_task(step.name, lp.argv, lp.cwd, lp.env, str(out_dir / "launch" / f"{step.name}.log"), ctx.tracker, run_id,
                    job=lp.job, step_dir=str(out_dir), max_pending_s=cfg.slurm.max_pending_s)
    final = out_dir / f"step-{plan.step:08d}"
    meta = CheckpointMeta(stage=stage, step=plan.step, tokens_seen=plan.tokens, recipe_hash=ctx.recipe_hash,
                          parent=parent, extra={"engine": engine})
    adopt_checkpoint(plan.export_dir, final, tokenizer_dir, meta)

    return CheckpointRef(path=str(final), step=plan.step, tokens_seen=plan.tokens,
                         sha256=read_meta(final).weight_sha256 or "")
