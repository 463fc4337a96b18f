"""`engine: nemo_rl`: the RL and distillation blocks as NeMo RL configs (plain dicts), and what stays ours.

NeMo RL (github.com/NVIDIA-NeMo/RL, read at commit NEMO_RL_COMMIT) trains GRPO and multi-teacher
on-policy distillation (MOPD) from one YAML file that names a base config under `defaults:` and
overrides it; the entry script takes `--config FILE` plus Hydra-style `key=value` overrides. Our
rows are NeMo Gym rows (data/rl_rows.py), so the translation targets NeMo RL's NeMo Gym path:

    grpo_config(stage, ...)      the RL block -> a GRPO config over examples/nemo_gym/grpo_nanov3.yaml
    distill_config(stage, ...)   the distill block -> the same GRPO trainer with `adv_estimator: opd`
                                 and an `on_policy_distillation` block (MOPD; our algorithm, section 7)
    unsupported(stage, ...)      our enabled features that NeMo RL cannot express: (field, why) each
    unsupported_distill(...)     the same for the distill block
    ordered_rows(...)            the difficulty filter and the Gaussian curriculum, realised as data:
                                 every step's prompts in step order, read with `data.shuffle: false`,
                                 each as NeMo Gym reads it (gym_row: its agent_ref, Responses-API tools,
                                 the fields its agent's resources server verifies with: GYM_SERVERS)
    argv(config_path, overrides) the entry (`python examples/nemo_gym/run_grpo_nemo_gym.py --config ...`)
    export_argv(config, out)     NeMo RL's own converter of the run's last checkpoint to Hugging Face

Steps: our `steps` are optimizer steps, NeMo RL's `max_num_steps` rollout steps. With
`rollout.minibatches: k` one rollout batch of prompts_per_step x G rows is k updates on our
engine; NeMo RL's policy trains `size // train_global_batch_size` global batches per rollout step,
one optimizer step each (megatron_policy_worker.py train), so train_global_batch_size = rows / k
and max_num_steps = steps / k. Its LR scheduler ticks once per rollout step (scheduler.step once
per train() call), so warmup and decay are counted in rollout steps.

Why MOPD and not NeMo RL's `distillation:` algorithm (examples/run_distillation.py,
distillation_math.yaml): that one matches the teacher's top-k logits with a forward/reverse/mixed
KL loss and one teacher; ours is the sampled-token advantage log π_T - log π_S with RL's loss and
one teacher per domain, which is exactly NeMo RL's MOPD (docs/about/algorithms/mopd.md).

The functions take the stage block duck-typed (recipe/blocks/rl.py's RLStage, recipe/blocks/distill.py
.DistillStage or anything with the same attributes, typed with the model/data/eval configs), so
model/ never imports flows/. The translation is best effort and total: for a feature in
`unsupported(...)` it writes the nearest NeMo RL setting, and the caller must keep such a stage
on our engine (or accept the difference knowingly). Nothing of NeMo RL is imported.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from stagewise.data.rl_rows import RLRow, write_rows
from stagewise.data.rl_sampler import CurriculumSampler
from stagewise.engines.config import LaunchConfig, Parallelism
from stagewise.engines.hydra_overrides import override_args

if TYPE_CHECKING:  # annotations only: the translation needs no torch
    from stagewise.data.rl_curriculum import CurriculumConfig
    from stagewise.eval.rewards import RewardConfig
    from stagewise.model.config import OptimizerConfig, ScheduleConfig
    from stagewise.model.objectives.grpo import GRPOConfig
    from stagewise.model.rl_batches import PlateauRule, RolloutSettings, SamplingSettings

NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
"""The NeMo RL commit whose configs and code the key names and values below were read from."""
BASE_CONFIG = "examples/nemo_gym/grpo_nanov3.yaml"
"""The base our configs compose on: NeMo RL's Nemotron 3 Nano GRPO config for NeMo Gym rollouts
(Megatron policy, async vLLM with its HTTP server on, which NeMo Gym needs). Its own Nemotron recipe
grpo-nanov3-30BA3B-2n8g-megatron_generation-async-gym.yaml composes on it the same way."""
ENTRY = "examples/nemo_gym/run_grpo_nemo_gym.py"
"""The entry script for NeMo Gym GRPO and MOPD (docs/about/algorithms/mopd.md runs MOPD with it)."""
DEFAULT_ROOT = "/opt/nemo-rl"
"""Where NeMo RL's checkout lies in its container (docker/Dockerfile: WORKDIR /opt/nemo-rl)."""
GYM_POLICY_SERVER = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
"""The NeMo Gym model server every Gym run lists first (grpo_nanov3.yaml: "Required! And it must be *for_training")."""
AGENT_TYPE = "responses_api_agents"
"""`agent_ref.type` of a NeMo Gym row (data/rl_rows.py)."""
GYM_SERVERS: dict[str, frozenset[str]] = {
    "math_with_judge": frozenset({"exact_answer"}),
    "string_match": frozenset({"exact_answer", "sorting"}),
    "equivalence_rule": frozenset({"exact_answer", "sorting"}),
    "structured_outputs": frozenset({"json_answer"}),
}
"""The NeMo Gym resources servers (directories under resources_servers/, read in nemo-gym 0.7.0) whose
verify request gym_row writes our rows for, each with our verifiers (eval/environments) it can verify.
An agent's server is the one its name contains (gym_server); a verifier mapped to an agent of a server
here that is not listed for it is refused (unsupported: `nemo_gym.agents.<verifier>`). What each reads
of a row (its app.py `<...>VerifyRequest`: the row's fields beside `responses_create_params` and the
policy's `response`), and what gym_row writes:

    math_with_judge     LibraryJudgeMathVerifyRequest: `question: str`, `expected_answer: str`
                        (pydantic's str refuses an int). It wraps expected_answer as
                        `\\boxed{<it>}` for math-verify, so the answer's text as a math verifier
                        parses it: str(n) for a number ("42", "-20"), a text kept; `question` the
                        prompt's last user message. Not sorting: math-verify reads "1, 2, 3" as a set
                        (3, 2, 1 verifies), so the order is lost; not json_answer/uppercase/calculator.
                        Note: its /verify scores 0 a response without `\\boxed{...}`, which our
                        prompts do not ask for.
    string_match        StringMatchVerifyRequest: `expected_answer: str`, `extraction_mode`
                        ("final_answer" unless given), `case_sensitive` (false). The answer's text
                        (a list as ", ".join of its items: its grader keeps the order, and reads
                        "1,2,3" and "1 2 3" as "1, 2, 3"); `extraction_mode: "full_response"` where
                        the row gives none: our verifiers judge the whole answer, and the default
                        mode finds nothing in a bare one. Not uppercase (it folds case by default),
                        json_answer, calculator.
    equivalence_rule    EquivalenceRuleVerifyRequest (NeMo Gym's agent: lc_equivalence_rule_simple_agent):
                        `expected_answer: str`, compared with the whole response lower-cased,
                        whitespace collapsed: the answer's text as for string_match.
    structured_outputs  StructuredOutputsVerifyRequest: `schema_str: str` (a JSON schema the
                        response must parse and validate as; no expected_answer): for json_answer the
                        object {"answer": <expected_answer>} as `const` (the server adds required and
                        additionalProperties false). Stricter than ours: "12" does not match 12.

Rows that name their own `agent_ref` are NeMo Gym's already and are left as they are."""
MEGATRON_CONVERTER = "examples/converters/convert_megatron_to_hf.py"
"""NeMo RL's converter of a Megatron policy checkpoint (`step_<n>/policy/weights/iter_0000000`) to HF;
it needs Megatron-Core, which NeMo RL's image keeps in its uv cache (`uv run --extra mcore`, the
converter's own docstring) and a venv has when synced with `--extra mcore`."""
DCP_CONVERTER = "examples/converters/convert_dcp_to_hf.py"
"""NeMo RL's converter of a DTensor policy checkpoint (torch DCP, `step_<n>/policy/weights`) to HF."""
MEGATRON_ITERATION = "iter_0000000"
"""The one iteration directory a NeMo RL Megatron save writes under policy/weights: its training
loop never advances Megatron's train_state.step (docs/design-docs/checkpointing.md converts
`step_<n>/policy/weights/iter_0000000` for every n)."""


class RLBlock(Protocol):
    """What the translation reads of the RL block (recipe/blocks/rl.py's RLStage has all of it)."""

    steps: int
    prompts_per_step: int
    rollout: RolloutSettings
    loss: GRPOConfig
    rewards: RewardConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    micro_batch: int
    precision: str
    checkpoint_every_steps: int | None
    reprofile: PlateauRule | None
    reasoning: bool


class DistillBlock(Protocol):
    """What the translation reads of the distill block (recipe/blocks/distill.py's DistillStage has it);
    `teachers` are objects with `name` and `domains`."""

    steps: int
    prompts_per_step: int
    rollout: SamplingSettings
    loss: GRPOConfig
    discount: float
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    micro_batch: int
    precision: str
    checkpoint_every_steps: int | None
    reasoning: bool
    teachers: Sequence[Any]
    default_teacher: str | None


@dataclass(frozen=True)
class MlflowTarget:
    """The MLflow run NeMo RL logs into (its logger.mlflow block; nemo_rl/utils/logger.py MLflowConfig).
    With `run_id` it resumes that run (the one the stage opened) instead of starting a new one."""

    experiment_name: str
    run_name: str
    tracking_uri: str | None = None
    run_id: str | None = None


Unsupported = list[tuple[str, str]]
"""(our field path, why NeMo RL cannot express it)."""


# ---------------------------------------------------------------------------------------------
# GRPO


def grpo_config(stage: RLBlock, *, model: str, launch: LaunchConfig, run_dir: str | os.PathLike,
                train_path: str, gym_config_paths: Sequence[str], max_prompt_tokens: int,
                mlflow: MlflowTarget, val_path: str | None = None, seed: int = 42,
                tokenizer: str | None = None) -> dict[str, Any]:
    """The RL block as a NeMo RL GRPO config (nested dict in NeMo RL's layout, `defaults:` first).

    `model` is the HF directory the policy starts from (its tokenizer too, unless `tokenizer`);
    `train_path` the JSONL rows to train on, in step order (ordered_rows: the difficulty filter and
    curriculum are applied there, so `data.shuffle` is false); `gym_config_paths` the NeMo Gym
    server configs that verify those rows; `max_prompt_tokens` the longest prompt, which with
    max_new_tokens sizes the sequence (as OnPolicyStage.steps_train_config does for our engine)."""
    ro, loss = stage.rollout, stage.loss
    cfg = _common(stage, ro, model=model, launch=launch, run_dir=run_dir, train_path=train_path,
                  gym_config_paths=gym_config_paths, max_prompt_tokens=max_prompt_tokens, mlflow=mlflow,
                  val_path=val_path, seed=seed, tokenizer=tokenizer)
    grpo = cfg["grpo"]
    # leave-one-out baseline, optionally / std; the estimator reads adv_estimator.*, not grpo.* (grpo.py
    # get_advantage_estimator), and grpo_nanov3.yaml has no adv_estimator block: set both
    grpo["normalize_rewards"] = ro.scale_by_std
    grpo["use_leave_one_out_baseline"] = True
    grpo["adv_estimator"] = {"name": "grpo", "normalize_rewards": ro.scale_by_std, "use_leave_one_out_baseline": True}
    # dynamic sampling (groups whose rewards all agree are dropped); async GRPO refuses it (run_grpo_nemo_gym.py)
    grpo["use_dynamic_sampling"] = not ro.off_policy
    grpo["dynamic_sampling_max_gen_batches"] = 1 + ro.max_refills
    grpo["batch_multiplier"] = 1
    grpo["reward_shaping"] = {"enabled": False}
    grpo["reward_scaling"] = {"enabled": False}
    cfg["loss_fn"] = _loss(loss, disable_ppo_ratio=False)
    return cfg


def distill_config(stage: DistillBlock, *, model: str, teacher_models: Mapping[str, str],
                   agents: Mapping[str, str], launch: LaunchConfig, run_dir: str | os.PathLike, train_path: str,
                   gym_config_paths: Sequence[str], max_prompt_tokens: int, mlflow: MlflowTarget,
                   teacher_parallel: Parallelism | None = None, teacher_nodes: int = 1,
                   val_path: str | None = None, seed: int = 42, tokenizer: str | None = None) -> dict[str, Any]:
    """The distill block as a NeMo RL MOPD config: GRPO's trainer with `adv_estimator: opd` (the
    per-token advantage log π_T - log π_S), the REINFORCE form (our ρ = 1), ICE-POP masked IS, no KL,
    and an `on_policy_distillation` block with one teacher per alias on its own GPUs.

    `teacher_models` maps a teacher's name to its HF directory; `agents` a prompt domain to the NeMo
    Gym agent its rows run under (`agent_ref.name`): NeMo RL routes a sample to its teacher by that
    agent name, we route by domain, so a domain's route becomes its agent's (teacher_routes). Each
    distinct teacher gets `teacher_nodes` nodes of `launch.gpus_per_node` GPUs with
    `teacher_parallel` (default: the student's tp/pp/cp/ep), reserved from `launch.nodes`."""
    ro = stage.rollout
    cfg = _common(stage, ro, model=model, launch=launch, run_dir=run_dir, train_path=train_path,
                  gym_config_paths=gym_config_paths, max_prompt_tokens=max_prompt_tokens, mlflow=mlflow,
                  val_path=val_path, seed=seed, tokenizer=tokenizer)
    grpo = cfg["grpo"]
    grpo["adv_estimator"] = {"name": "opd"}
    grpo["use_dynamic_sampling"] = False
    by_alias, default_alias = teacher_routes(stage, teacher_models, agents)
    tp = teacher_parallel or launch.parallel
    distinct = len(set(by_alias.values()))
    if launch.nodes - distinct * teacher_nodes < 1:
        raise ValueError(f"{distinct} teacher(s) x {teacher_nodes} node(s) leave no node of {launch.nodes} for "
                         "the student (NeMo RL reserves teacher nodes from cluster.num_nodes)")
    cfg["loss_fn"] = _loss(stage.loss, disable_ppo_ratio=True)
    cfg["on_policy_distillation"] = {
        "enabled": True,
        "teacher_model_by_agent_name": by_alias,
        "default_teacher_alias": default_alias,
        "strict_agent_name_match": default_alias is None,  # ours: a prompt without a route is an error
        "deduplicate_shared_teacher_checkpoints": True,
        "non_colocated_teachers": {
            "enabled": True,
            "default_teacher_cfg": {
                "tensor_model_parallel_size": tp.tp, "pipeline_model_parallel_size": tp.pp,
                "context_parallel_size": tp.cp, "expert_model_parallel_size": tp.ep,
                "num_nodes": teacher_nodes, "gpus_per_node": launch.gpus_per_node,
                "precision": "bf16", "micro_batch_size": _micro_batch(stage, ro),
            },
        },
    }
    return cfg


def teacher_routes(stage: DistillBlock, teacher_models: Mapping[str, str],
                   agents: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """(NeMo RL's teacher_model_by_agent_name, default_teacher_alias) from our domain routes.

    A domain routed to the default teacher needs no entry (an unmapped agent falls back to the
    default alias, opd.py resolve_reference_aliases); the default teacher's alias is its name.
    ValueError names a teacher without a model, a domain without an agent, or an agent whose
    domains go to different teachers (NeMo RL cannot tell them apart)."""
    missing = [t.name for t in stage.teachers if t.name not in teacher_models]
    if missing:
        raise ValueError(f"no HF directory for teacher(s) {', '.join(missing)}")
    default = stage.default_teacher
    by_alias: dict[str, str] = {default: teacher_models[default]} if default else {}
    owner: dict[str, str] = {}
    for t in stage.teachers:
        for d in t.domains:
            if d not in agents:
                raise ValueError(f"domain {d!r} (teacher {t.name}) has no NeMo Gym agent")
            a = agents[d]
            if owner.setdefault(a, t.name) != t.name:
                raise ValueError(f"NeMo Gym agent {a!r} serves domains of two teachers ({owner[a]}, {t.name}); "
                                 "NeMo RL routes teachers by agent name")
            if t.name != default:
                by_alias[a] = teacher_models[t.name]
    return by_alias, default


def _common(stage: Any, ro: SamplingSettings, *, model: str, launch: LaunchConfig, run_dir: str | os.PathLike,
            train_path: str, gym_config_paths: Sequence[str], max_prompt_tokens: int, mlflow: MlflowTarget,
            val_path: str | None, seed: int, tokenizer: str | None) -> dict[str, Any]:
    """What GRPO and MOPD share: steps and batch geometry, off-policy, sampling, policy (Megatron,
    parallel sizes, optimizer, schedule), checkpoints, logger, cluster, data and environment."""
    run = Path(run_dir)
    rows = stage.prompts_per_step * ro.group_size
    k = minibatches(ro)
    seq = max_prompt_tokens + ro.max_new_tokens
    root = launch.env.workdir or DEFAULT_ROOT
    par = launch.parallel
    precision = _precision(stage.precision)
    megatron: dict[str, Any] = {
        "enabled": True,
        "tensor_model_parallel_size": par.tp, "pipeline_model_parallel_size": par.pp,
        "context_parallel_size": par.cp, "expert_model_parallel_size": par.ep,
        "sequence_parallel": par.sequence_parallel,
        "optimizer": _optimizer(stage.optimizer, precision),
        "scheduler": _scheduler(stage.schedule, rollout_steps(stage), rows * seq),
    }
    if par.etp is not None:
        megatron["expert_tensor_parallel_size"] = par.etp
    data: dict[str, Any] = {
        "shuffle": False,  # the rows are already in step order (ordered_rows)
        "train": {"data_path": str(train_path)},
        "validation": {"data_path": str(val_path)} if val_path else None,
        "default": {"dataset_name": "NemoGymDataset", "env_name": "nemo_gym", "prompt_file": None,
                    "system_prompt_file": None, "processor": "nemo_gym_data_processor"},
    }
    paths = list(gym_config_paths)
    if GYM_POLICY_SERVER not in paths:
        paths.insert(0, GYM_POLICY_SERVER)
    return {
        "defaults": f"{root}/{BASE_CONFIG}",
        "grpo": {
            "num_prompts_per_step": stage.prompts_per_step,
            "num_generations_per_prompt": ro.group_size,
            "max_num_steps": rollout_steps(stage),
            "max_num_epochs": 1,  # the ordered rows hold every rollout step's batch (and refills)
            "max_rollout_turns": 1,
            "seed": seed,
            "overlong_filtering": False,  # ours scores a cut response like any other
            "seq_logprob_error_threshold": None,  # ours masks tokens (IS band), never whole sequences
            # in-run validation off: the stage scores held-out pass@1 itself, before and after
            "val_period": 0, "val_at_start": False, "val_at_end": bool(val_path),
            "async_grpo": {
                "enabled": ro.off_policy,  # one-step off-policy: at most one update stale
                "max_trajectory_age_steps": 1,
                "in_flight_weight_updates": False,  # ours never swaps weights mid-rollout
            },
        },
        "policy": {
            "model_name": model,
            "tokenizer": {"name": tokenizer or model},
            "train_global_batch_size": rows // k,  # k optimizer updates per rollout step
            "train_micro_batch_size": _micro_batch(stage, ro),
            "logprob_batch_size": _micro_batch(stage, ro),
            "max_total_sequence_length": seq,
            "precision": precision,
            "max_grad_norm": stage.optimizer.grad_clip,
            "dtensor_cfg": {"enabled": False},
            "megatron_cfg": megatron,
            "generation": {"temperature": ro.temperature, "top_p": 1.0, "top_k": None,
                           "max_new_tokens": ro.max_new_tokens},
        },
        "checkpointing": {
            "enabled": True,
            "checkpoint_dir": str(run / "checkpoints"),
            # in rollout steps; NeMo RL also saves the last step
            "save_period": max(1, (stage.checkpoint_every_steps or stage.steps) // k),
            "metric_name": None,  # no in-run validation metric: keep the latest
        },
        "logger": {
            "log_dir": str(run / "logs"),
            "mlflow_enabled": True, "wandb_enabled": False, "tensorboard_enabled": False, "swanlab_enabled": False,
            "mlflow": {k: v for k, v in (("experiment_name", mlflow.experiment_name), ("run_name", mlflow.run_name),
                                         ("tracking_uri", mlflow.tracking_uri), ("run_id", mlflow.run_id))
                       if v is not None},
        },
        "cluster": {"num_nodes": launch.nodes, "gpus_per_node": launch.gpus_per_node},
        "data": data,
        "env": {"should_use_nemo_gym": True, "nemo_gym": {"config_paths": paths}},
    }


def _loss(cfg: GRPOConfig, *, disable_ppo_ratio: bool) -> dict[str, Any]:
    """loss_fn (loss_functions.py ClippedPGLossConfig): our clip, masked IS band and k3 KL.

    Masked IS w = exp(train - rollout) kept iff is_low <= w <= is_high is NeMo RL's ICE-POP type
    ("zero out tokens with IS weight outside [min, max]"), on top of use_importance_sampling_correction.
    Our k3 is unclamped, hence no clamp values."""
    return {
        "ratio_clip_min": cfg.eps_low, "ratio_clip_max": cfg.eps_high, "ratio_clip_c": None,
        "disable_ppo_ratio": disable_ppo_ratio, "force_on_policy_ratio": False, "use_cispo": False,
        "reference_policy_kl_penalty": cfg.kl_coeff, "reference_policy_kl_type": "k3",
        "kl_input_clamp_value": None, "kl_output_clamp_value": None,
        "use_kl_in_reward": False, "use_on_policy_kl_approximation": False,
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "icepop",
        "truncated_importance_sampling_ratio": cfg.is_high,
        "truncated_importance_sampling_ratio_min": cfg.is_low,
        "sequence_level_importance_ratios": False,
        "token_level_loss": True,  # sum over the global batch's response tokens / their count
    }


def _optimizer(opt: OptimizerConfig, precision: str) -> dict[str, Any]:
    """megatron_cfg.optimizer (Megatron's Adam is AdamW: decoupled decay). clip_grad stays the base's
    ${policy.max_grad_norm}, which policy.max_grad_norm sets."""
    return {"optimizer": "adam", "lr": opt.lr, "min_lr": opt.min_lr, "weight_decay": opt.weight_decay,
            "adam_beta1": opt.betas[0], "adam_beta2": opt.betas[1], "adam_eps": opt.eps,
            "bf16": precision == "bfloat16"}


def _scheduler(sched: ScheduleConfig, steps: int, tokens_per_step: int) -> dict[str, Any]:
    """megatron_cfg.scheduler: our schedule over tokens as Megatron's over iterations, one per rollout
    step (`steps` of `tokens_per_step` tokens each; NeMo RL ticks the scheduler once per train() call).
    Ours warms up linearly from 0; wsd has no NeMo RL schema field and is written as constant."""
    out: dict[str, Any] = {
        "lr_decay_style": "cosine" if sched.kind == "cosine" else "constant",
        "lr_warmup_iters": round(sched.warmup_tokens / tokens_per_step),
        "lr_warmup_init": 0.0,
    }
    if sched.kind == "cosine":
        out["lr_decay_iters"] = steps
    return out


def _precision(precision: str) -> str:
    """NeMo RL runs on GPUs: auto is bf16 there, as on our engine."""
    return "float32" if precision == "fp32" else "bfloat16"


def _micro_batch(stage: Any, ro: SamplingSettings) -> int:
    """Responses per forward/backward, a divisor of an optimizer step's rows (as OnPolicyStage.steps_train_config)."""
    return math.gcd(stage.prompts_per_step * ro.group_size // minibatches(ro), stage.micro_batch)


def minibatches(ro: SamplingSettings) -> int:
    """Optimizer steps per rollout batch (RL's rollout.minibatches; distillation samples have none: 1)."""
    return ro.optimizer_steps()


def rollout_steps(stage: Any) -> int:
    """NeMo RL's max_num_steps: the stage's optimizer steps in rollout batches."""
    return stage.steps // minibatches(stage.rollout)


# ---------------------------------------------------------------------------------------------
# What stays on our engine


def unsupported(stage: RLBlock, *, environments: Iterable[str] = (), gym_agents: Mapping[str, str] | None = None,
                max_prompt_tokens: int | None = None) -> Unsupported:
    """Our enabled RL features NeMo RL cannot express, as (field path, why); empty: it can run there.

    `environments` are our verifiers the rows use (eval/environments names), `gym_agents` which of
    them a NeMo Gym agent verifies instead (name -> agent); `max_prompt_tokens` lets the warmup's
    conversion to whole steps be checked. The difficulty filter and the curriculum are not listed:
    they run on our side and reach NeMo RL as ordered rows (ordered_rows)."""
    ro, loss = stage.rollout, stage.loss
    out = _shared(stage, ro, environments, gym_agents, max_prompt_tokens)
    if ro.off_policy:
        out.append(("rollout.off_policy", "NeMo RL's async GRPO refuses use_dynamic_sampling "
                    "(examples/nemo_gym/run_grpo_nemo_gym.py), so groups whose rewards all agree stay in the "
                    "batch with advantage 0 and count in the token mean; ours drops them"))
    if ro.scale_by_std:
        out.append(("rollout.scale_by_std", "NeMo RL's normalize_rewards divides by the std of the other G-1 "
                    "rewards (utils.py calculate_baseline_and_std_per_prompt, leave-one-out); ours by the whole "
                    "group's"))
    if loss.kl_coeff > 0:
        out.append(("grpo.kl_coeff", "NeMo RL's k3 term carries the score-function gradient (k3 x exp(logp - "
                    "sg(logp)), loss_functions.py); ours differentiates k3 alone"))
    k, rows = ro.minibatches, stage.prompts_per_step * ro.group_size
    if rows % k:
        out.append(("rollout.minibatches", f"NeMo RL trains whole global batches of train_global_batch_size rows "
                    f"(megatron_policy_worker.py train: size // gbs of them); {rows} rows per rollout step do not "
                    f"split into {k} equal parts"))
    elif k > 1 and (stage.schedule.warmup_tokens or stage.schedule.kind != "constant"):
        out.append(("rollout.minibatches", "NeMo RL's LR scheduler ticks once per rollout step (scheduler.step "
                    "once per train() call), ours once per optimizer step: with a warmup or a decay the "
                    f"{k} updates of a batch would share one learning rate"))
    if stage.reprofile is not None:
        out.append(("reprofile", "re-profiling needs the current policy mid-run; NeMo RL has no hook to reorder "
                    "its data, and the ordered rows are fixed before the launch"))
    r = stage.rewards
    if r.accuracy != 1.0:
        out.append(("rewards.accuracy", "the reward is the NeMo Gym verifier's; a weight on it is ours"))
    if r.format > 0:
        out.append(("rewards.format", "our well_formed reward has no NeMo Gym / NeMo RL counterpart"))
    if r.length > 0:
        out.append(("rewards.length", "our group-relative length term (correct completions ranked shorter first) "
                    "has no counterpart: reward_shaping is DAPO's overlong penalty, nemo_gym effort_levels a "
                    "length upper bound"))
    return out


def unsupported_distill(stage: DistillBlock, *, environments: Iterable[str] = (),
                        gym_agents: Mapping[str, str] | None = None,
                        max_prompt_tokens: int | None = None) -> Unsupported:
    """unsupported(...) for the distill block (MOPD). Teacher routes that clash on a NeMo Gym agent
    are distill_config's ValueError, not listed here (they depend on the agents handed in)."""
    ro = stage.rollout
    out = _shared(stage, ro, environments, gym_agents, max_prompt_tokens)
    if not ro.off_policy:
        out.append(("rollout.off_policy", "NeMo RL scores MOPD teachers only in async_grpo_train "
                    "(grpo.py; docs/about/algorithms/mopd.md): a synchronous run has no teacher"))
    if stage.discount > 0:
        out.append(("discount", "NeMo RL's OPD advantage is the token's own log π_T - log π_S "
                    "(advantage_estimator.py OPDAdvantageEstimator), never a discounted sum"))
    return out


def _shared(stage: Any, ro: SamplingSettings, environments: Iterable[str], gym_agents: Mapping[str, str] | None,
            max_prompt_tokens: int | None) -> Unsupported:
    out: Unsupported = []
    gym = gym_agents or {}
    for env in sorted(set(environments)):
        if env not in gym:
            out.append((f"environment.{env}", f"our verifier {env!r} (eval/environments) runs in our process; "
                        "NeMo RL scores rows with NeMo Gym servers (env.nemo_gym): give a Gym agent for it"))
        elif (server := gym_server(gym[env])) is not None and env not in GYM_SERVERS[server]:
            out.append((f"environment.{env}", f"NeMo Gym agent {gym[env]!r} verifies with the {server} resources "
                        f"server, which cannot verify our {env!r} rows: {_CANNOT[server]}; it verifies "
                        f"{', '.join(sorted(GYM_SERVERS[server]))} rows"))
    if ro.recompute_old_logprobs:
        out.append(("rollout.recompute_old_logprobs", "NeMo RL's ratio is against the trainer's log-probs under "
                    "the current weights (prev_logprobs); π_old under the sampling weights is not an option"))
    if not stage.reasoning:
        out.append(("reasoning", "NeMo Gym renders the prompt server-side with the HF directory's chat template "
                    "and its defaults (our template: reasoning on); reasoning off is a template kwarg this "
                    "translation does not pass"))
    opt, sched = stage.optimizer, stage.schedule
    if opt.weight_decay > 0:
        out.append(("optimizer.weight_decay", "Megatron-Core's default parameter groups exempt only biases and "
                    "1-D tensors from decay; ours also exempts embeddings"))
    if sched.kind == "wsd":
        out.append(("schedule.kind", "wsd has no field in NeMo RL's MegatronSchedulerConfig (written as constant; "
                    "Megatron-Bridge's lr_wsd_* keys would pass through its SchedulerConfig(**), untested here)"))
    if sched.warmup_tokens and max_prompt_tokens is not None:
        per_step = stage.prompts_per_step * ro.group_size * (max_prompt_tokens + ro.max_new_tokens)
        if sched.warmup_tokens % per_step:
            out.append(("schedule.warmup_tokens", f"Megatron warms up over whole iterations; "
                        f"{sched.warmup_tokens} tokens is {sched.warmup_tokens / per_step:.2f} steps of {per_step}"))
    return out


# ---------------------------------------------------------------------------------------------
# Data and launch


def ordered_rows(rows: Mapping[str, RLRow], by_domain: Mapping[str, Sequence[tuple[str, float]]], *,
                 ratios: Mapping[str, float], batch_size: int, total_steps: int,
                 curriculum: CurriculumConfig | None, seed: int,
                 agent_of: Callable[[str], str] | None = None, spare_batches: int = 0) -> list[RLRow]:
    """Every step's prompts, step after step: what our engine's sampler (data/rl_sampler.py
    CurriculumSampler, first draws) trains on, as rows for NeMo RL to read in order.

    `by_domain` is what the stage hands the sampler: the difficulty filter's kept ids with their
    pass rates, per domain. Steps 1..total_steps give batch_size ids each, so a NeMo RL run with
    num_prompts_per_step = batch_size and shuffling off trains step s on our step s's prompts (a
    dynamic-sampling refill reads the next step's). `spare_batches` more follow, drawn as refills
    of the last step (attempts 1, 2, ...), so refills never exhaust the rows before the last step:
    NeMo RL ends at the end of its data, short of max_num_steps. `agent_of` names the NeMo Gym
    agent of a row (by prompt id) without an `agent_ref`; each row is written as gym_row gives it
    (ValueError: a row whose answer its agent's resources server cannot take)."""
    sampler = CurriculumSampler({d: list(v) for d, v in by_domain.items()}, dict(ratios), batch_size,
                                total_steps, curriculum, seed)
    draws = [(step, 0) for step in range(1, total_steps + 1)] + [(total_steps, a) for a in range(1, spare_batches + 1)]
    out = []
    for step, attempt in draws:
        for pid in sampler.sample(step, attempt):
            out.append(gym_row(rows[pid], agent_of(pid) if agent_of is not None else None))
    return out


def gym_server(agent: str) -> str | None:
    """The resources server of GYM_SERVERS a NeMo Gym agent verifies with, from its name: the server
    whose name the agent's contains as whole `_`-separated words (NeMo Gym's configs name an agent
    after its server: math_with_judge_simple_agent, lc_equivalence_rule_simple_agent,
    structured_outputs_v3_simple_agent); None for any other agent, whose rows gym_row leaves as they
    are. The agent's config (under the user's `config_paths`) lies in NeMo Gym's checkout, where the
    run is launched, not here: the name is what the recipe check and the stage can read."""
    words = f"_{agent}_"
    found = [s for s in GYM_SERVERS if f"_{s}_" in words]
    return max(found, key=len) if found else None


_CANNOT = {
    "math_with_judge": "it compares one math value (math-verify on \\boxed{expected_answer}: a comma-separated "
                       "list is read as a set, so a sorting answer's order is lost)",
    "string_match": "it compares the answer's text with expected_answer, case folded unless case_sensitive",
    "equivalence_rule": "it compares the whole answer's text with expected_answer, lower-cased",
    "structured_outputs": "it validates the answer against a JSON schema (schema_str), which only our json_answer "
                          "rows become",
}


def _answer_text(value: Any, *, lists: bool, agent: str, row_id: Any) -> str:
    """expected_answer as the text a string-comparing server reads: a str as it is, a number as str()
    ("42"), a list (when the server keeps order) as ", ".join of its items' texts."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if lists and isinstance(value, list) and value and all(
            isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return ", ".join(map(str, value))
    takes = ("a number, a text or a list of them (as text)" if lists else
             "one math value, a number or a text (math-verify would read a list as a set)")
    raise ValueError(f"row {row_id}: expected_answer {value!r} cannot be verified by NeMo Gym agent {agent!r}: "
                     f"{gym_server(agent)} takes {takes}")


def _last_user_text(row: RLRow) -> str:
    value = row.responses_create_params.input
    if isinstance(value, str):
        return value
    users = [m for m in value if m.get("role") == "user"]
    if not users:
        raise ValueError(f"row {row.id}: no user message for math_with_judge's `question`")
    content = users[-1]["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def server_fields(row: RLRow, agent: str) -> dict[str, Any]:
    """The fields the verify request of `agent`'s resources server needs that the row lacks or holds
    in another form (GYM_SERVERS: what each reads, the forms written); {} for an agent of no server
    there. ValueError names a row whose answer the server cannot take."""
    server = gym_server(agent)
    obj = row.as_json()
    out: dict[str, Any] = {}
    if server in ("math_with_judge", "string_match", "equivalence_rule"):
        text = _answer_text(obj.get("expected_answer"), lists=server != "math_with_judge", agent=agent,
                            row_id=row.id)
        if text != obj.get("expected_answer"):
            out["expected_answer"] = text
    if server == "math_with_judge" and not isinstance(obj.get("question"), str):
        out["question"] = _last_user_text(row)
    if server == "string_match" and "extraction_mode" not in obj:
        out["extraction_mode"] = "full_response"
    if server == "structured_outputs" and not isinstance(obj.get("schema_str"), str):
        answer = obj.get("expected_answer")
        if answer is None or isinstance(answer, (dict, list)):
            raise ValueError(f"row {row.id}: expected_answer {answer!r} cannot be verified by NeMo Gym agent "
                             f"{agent!r} (structured_outputs: {{\"answer\": <a number or a text>}} as its schema)")
        out["schema_str"] = json.dumps({"type": "object", "properties": {"answer": {"const": answer}},
                                        "required": ["answer"], "additionalProperties": False})
    return out


def gym_row(row: RLRow, agent: str | None = None) -> RLRow:
    """The row as NeMo Gym reads it: `agent_ref` set to `agent` where the row names none, with the
    fields the verify request of that agent's resources server reads (server_fields, GYM_SERVERS:
    e.g. for math_with_judge `expected_answer` "42" for 42 and `question`), and its tools as
    Responses-API tools (responses_tools); the row itself where nothing changes. A row with its own
    `agent_ref` is NeMo Gym's already: its fields are kept. ValueError: an answer that server cannot take."""
    obj = row.as_json()
    changed: dict[str, Any] = {}
    if agent is not None and "agent_ref" not in obj:
        changed["agent_ref"] = {"type": AGENT_TYPE, "name": agent}
        changed.update(server_fields(row, agent))
    params = obj["responses_create_params"]
    if "tools" in params:
        tools = responses_tools(params["tools"])
        if tools is None or tools != params["tools"]:
            changed["responses_create_params"] = {k: v for k, v in {**params, "tools": tools}.items()
                                                  if k != "tools" or v is not None}
    return RLRow.model_validate({**obj, **changed}) if changed else row


def responses_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tool definitions as the Responses API has them, which NeMo Gym validates
    (`responses_create_params.tools` is a list of openai's ToolParam; a function tool is flat:
    `{"type": "function", "name", "description", "parameters", "strict"}`, name, parameters and strict
    required). Our rows carry Chat-Completions definitions (`{"type": "function", "function": {...}}`,
    data/world/calculator.py), which it rejects: each becomes the flat form, `strict` false unless given
    (the Chat-Completions default). Other tools are kept; None (no tools) stays None, dropped by gym_row."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function") if tool.get("type") == "function" else None
        if isinstance(fn, dict) and "name" not in tool:
            flat = {"type": "function", "name": fn["name"]}
            if "description" in fn:
                flat["description"] = fn["description"]
            flat["parameters"] = fn.get("parameters")
            flat["strict"] = fn.get("strict", False)
            out.append(flat)
        else:
            out.append(tool)
    return out


def write_ordered_rows(path: str | os.PathLike, rows: Mapping[str, RLRow],
                       by_domain: Mapping[str, Sequence[tuple[str, float]]], **kwargs: Any) -> Path:
    """ordered_rows(...) written as JSONL (data/rl_rows.write_rows); returns the path."""
    return write_rows(path, ordered_rows(rows, by_domain, **kwargs))


def write_config(config: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """The config as YAML, `defaults:` first (NeMo RL's load_config pops it and merges the rest over it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path


def argv(config_path: str | os.PathLike, overrides: Mapping[str, Any] | Sequence[str] = ()) -> list[str]:
    """The entry: `python examples/nemo_gym/run_grpo_nemo_gym.py --config FILE k=v ...`, run in NeMo
    RL's checkout (launch.env.workdir). Overrides are Hydra `key=value` strings, or a mapping written
    as such (hydra_overrides.override_args)."""
    if isinstance(overrides, Mapping):
        overrides = override_args(overrides)
    return ["python", ENTRY, "--config", str(config_path), *overrides]


def last_checkpoint(config: Mapping[str, Any]) -> Path:
    """Where the run's last save lands: `<checkpointing.checkpoint_dir>/step_<max_num_steps>`
    (utils/checkpoint.py CheckpointManager names a save after its 1-based rollout step, and
    grpo.py saves the last step whatever save_period says)."""
    return Path(config["checkpointing"]["checkpoint_dir"]) / f"step_{config['grpo']['max_num_steps']}"


def export_argv(config: Mapping[str, Any], hf_dir: str | os.PathLike, *, image: bool) -> list[str]:
    """NeMo RL's converter of the last checkpoint to a Hugging Face directory `hf_dir`, run in its checkout.

    The policy decides which: Megatron (`policy.megatron_cfg.enabled`, our base's) is
    convert_megatron_to_hf.py on `policy/weights/iter_0000000`, the HF model and tokenizer read
    from the step's config.yaml; DTensor is convert_dcp_to_hf.py on `policy/weights`. In NeMo RL's
    image the Megatron converter runs under `uv run --extra mcore` (the image's default venv lacks
    Megatron-Core); a venv (`image` false) must have been synced with the mcore extra."""
    step = last_checkpoint(config)
    weights = step / "policy" / "weights"
    if config["policy"].get("megatron_cfg", {}).get("enabled"):
        python = ["uv", "run", "--extra", "mcore", "python"] if image else ["python"]
        return [*python, MEGATRON_CONVERTER, "--config", str(step / "config.yaml"),
                "--megatron-ckpt-path", str(weights / MEGATRON_ITERATION), "--hf-ckpt-path", str(hf_dir)]
    return ["python", DCP_CONVERTER, "--config", str(step / "config.yaml"), "--dcp-ckpt-path", str(weights),
            "--hf-ckpt-path", str(hf_dir)]


__all__ = ["AGENT_TYPE", "BASE_CONFIG", "DCP_CONVERTER", "DEFAULT_ROOT", "ENTRY", "GYM_POLICY_SERVER", "GYM_SERVERS",
           "MEGATRON_CONVERTER", "MEGATRON_ITERATION", "NEMO_RL_COMMIT", "DistillBlock", "MlflowTarget", "RLBlock",
           "Unsupported", "argv", "distill_config", "export_argv", "grpo_config", "gym_row", "gym_server",
           "last_checkpoint", "minibatches", "ordered_rows", "responses_tools", "rollout_steps", "server_fields",
           "teacher_routes", "unsupported", "unsupported_distill", "write_config", "write_ordered_rows"]
