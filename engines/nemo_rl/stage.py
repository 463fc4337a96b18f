"""`engine: nemo_rl`: what RL and distillation hand NeMo RL, and what they get back.

Our side keeps what NeMo RL has no hook for and hands it over as data: the difficulty profile and
filter and the curriculum become the rows themselves (engines/nemo_rl/translate.py's ordered_rows: each
rollout step's prompts in step order, then spare refill batches so that dynamic sampling never
ends the run short of its last step). Each row carries the NeMo Gym agent that verifies it (its
own `agent_ref`, else `nemo_gym.agents` of its verifier), for an agent of a resources server in
translate.GYM_SERVERS the fields that server's verify request reads (e.g. math_with_judge:
`expected_answer` as text, `question`), and its tools as Responses-API tools (translate.gym_row;
tests/engines/nemo_rl/test_real_gym_rows.py checks the rows against the released NeMo Gym's row
models and those servers' verify requests). A row whose answer its server cannot take is refused
(BadInput, exit 2) before anything launches. Into the step directory go

    nemo-rl/train.jsonl             the ordered NeMo Gym rows
    nemo-rl/grpo.yaml | mopd.yaml   the config over NeMo RL's Nemotron 3 Nano Gym base, logging
                                    into the stage's own MLflow run (logger.mlflow.run_id)

then two launches through engines/launch/stage.py's run_engine, each one Prefect task:

    nemo-rl-train    python examples/nemo_gym/run_grpo_nemo_gym.py --config nemo-rl/<config>.yaml
                     (one driver, style "single": its Ray places the policy, vLLM and teachers)
    nemo-rl-export   NeMo RL's converter of nemo-rl/checkpoints/step_<n> (its last save) to
                     nemo-rl-export/, a Hugging Face directory (one node, one GPU)

and the export is adopted as the stage's `step-<steps>`; the stage scores it with its own held-out
evaluation, as it scores our engine's. What NeMo RL cannot express is refused at the recipe check
(engines/nemo_rl/checks.py) and, for what only the rows tell, here at the stage's start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagewise.data.errors import BadInput
from stagewise.engines.config import LaunchConfig, NemoGym
from stagewise.engines.launch.stage import EnginePlan, EngineStep
from stagewise.engines.nemo_rl import translate as nemo_rl
from stagewise.engines.nemo_rl.checks import domain_agents, refusals
from stagewise.engines.nemo_rl.translate import MlflowTarget

RUN_DIR = "nemo-rl"
"""NeMo RL's run directory inside the step directory: rows, config, checkpoints, logs."""
EXPORT_DIR = "nemo-rl-export"
"""Where the converter writes the Hugging Face export that is adopted."""


def _own_agent(row) -> str | None:
    ref = row.row.as_json().get("agent_ref")
    return ref.get("name") if isinstance(ref, dict) else None


def gym_environments(rows) -> set[str]:
    """Our verifiers of the rows (eval/rl_wiring.ResolvedRow) that name no NeMo Gym agent of their own."""
    return {r.environment for r in rows if _own_agent(r) is None}


def row_agents(rows, gym: NemoGym | None) -> dict[str, str]:
    """prompt id -> the NeMo Gym agent of its row: the row's own `agent_ref`, else its verifier's
    in `nemo_gym.agents` (rows with neither are refused before: refuse_unsupported)."""
    agents = gym.agents if gym else {}
    return {r.id: _own_agent(r) or agents[r.environment] for r in rows if _own_agent(r) or r.environment in agents}


def refuse_unsupported(at: str, unsupported: nemo_rl.Unsupported) -> None:
    """BadInput (exit 2) naming each field NeMo RL cannot express, before anything trains."""
    if unsupported:
        raise BadInput("engine nemo_rl: " + "; ".join(f"{path}: {why}" for path, why, _ in refusals(at, unsupported)))


def mlflow_target(tracker, run_id: str, run_name: str) -> MlflowTarget:
    """NeMo RL's logger pointed at the stage's own MLflow run."""
    return MlflowTarget(experiment_name=tracker.experiment, run_name=run_name, tracking_uri=tracker.uri, run_id=run_id)


def _launches(config: dict[str, Any], name: str, launch: LaunchConfig, out_dir: Path, step: int) -> EnginePlan:
    """Write `config` as `nemo-rl/<name>.yaml`; the driver launch, then the converter's."""
    path = nemo_rl.write_config(config, out_dir / RUN_DIR / f"{name}.yaml")
    export = out_dir / EXPORT_DIR
    steps = [EngineStep("nemo-rl-train", nemo_rl.argv(path), style="single"),
             EngineStep("nemo-rl-export", nemo_rl.export_argv(config, export, image=launch.env.image is not None),
                        one_node=True)]
    return EnginePlan(steps=steps, export_dir=export, step=step, tokens=0)


def _write_rows(at: str, out_dir: Path, rows, by_domain, **kwargs) -> Path:
    """`nemo-rl/train.jsonl` (translate.write_ordered_rows); a row whose answer its agent's resources
    server cannot take is BadInput (exit 2) naming `<at>.nemo_gym.agents`."""
    try:
        return nemo_rl.write_ordered_rows(out_dir / RUN_DIR / "train.jsonl", rows, by_domain, **kwargs)
    except ValueError as e:
        raise BadInput(f"{at}.nemo_gym.agents: engine nemo_rl: {e} (or use engine torch)") from None


def rl_plan(stage, *, start: str, rows: dict[str, Any], agents: dict[str, str],
            by_domain: dict[str, list[tuple[str, float]]], ratios: dict[str, float], max_prompt_tokens: int,
            out_dir: Path, seed: int, mlflow: MlflowTarget) -> EnginePlan:
    """The RL block (`stage`, recipe/blocks/rl.py's RLStage) on NeMo RL: the rows (`rows`: prompt id ->
    RLRow, `agents`: prompt id -> agent) the filter kept (`by_domain`, with pass rates) in the
    order our sampler would draw them, the GRPO config, the launches."""
    rollout_steps = nemo_rl.rollout_steps(stage)
    refills = stage.rollout.max_refills if not stage.rollout.off_policy else 0  # dynamic sampling: sync only
    train = _write_rows("stages.rl", out_dir, rows, by_domain, ratios=ratios, batch_size=stage.prompts_per_step,
                        total_steps=rollout_steps, curriculum=stage.curriculum, seed=seed,
                        agent_of=agents.__getitem__, spare_batches=rollout_steps * refills)
    config = nemo_rl.grpo_config(stage, model=start, launch=stage.launch, run_dir=out_dir / RUN_DIR,
                                 train_path=str(train), gym_config_paths=stage.nemo_gym.config_paths,
                                 max_prompt_tokens=max_prompt_tokens, mlflow=mlflow, seed=seed)
    return _launches(config, "grpo", stage.launch, out_dir, stage.steps)


def distill_plan(stage, *, student: str, teachers: dict[str, str], rows: dict[str, Any], agents: dict[str, str],
                 by_domain: dict[str, list[tuple[str, float]]], ratios: dict[str, float], max_prompt_tokens: int,
                 out_dir: Path, seed: int, mlflow: MlflowTarget) -> EnginePlan:
    """One distillation round (`stage`, recipe/blocks/distill.py's DistillStage) on NeMo RL's MOPD: the
    prompts in our sampler's order (no curriculum), the teachers' HF directories routed by the
    agent of their domains' rows, the launches."""
    train = _write_rows("stages.distill", out_dir, rows, by_domain, ratios=ratios, batch_size=stage.prompts_per_step,
                        total_steps=stage.steps, curriculum=None, seed=seed, agent_of=agents.__getitem__)
    per_domain = {d: {agents[i] for i, _ in ids} for d, ids in by_domain.items()}
    routes, clashes = domain_agents(per_domain, "stages.distill")
    if clashes:
        raise BadInput("; ".join(f"{path}: {why}" for path, why, _ in clashes))
    try:
        config = nemo_rl.distill_config(stage, model=student, teacher_models=teachers, agents=routes,
                                        launch=stage.launch, run_dir=out_dir / RUN_DIR, train_path=str(train),
                                        gym_config_paths=stage.nemo_gym.config_paths,
                                        max_prompt_tokens=max_prompt_tokens, mlflow=mlflow, seed=seed)
    except ValueError as e:
        raise BadInput(f"stages.distill: engine nemo_rl: {e}") from None
    return _launches(config, "mopd", stage.launch, out_dir, stage.steps)
