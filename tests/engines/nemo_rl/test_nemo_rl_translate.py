"""The RL / distill blocks as NeMo RL configs (engines/nemo_rl/translate.py), checked against NeMo RL's own
example configs, transcribed by hand below, and what stays on our engine.

Upstream: github.com/NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909. Each table names
the file it was transcribed from, with `defaults:` resolved by hand (the recipe's value over its base's)
and `${...}` interpolations resolved; a key absent from both comes from the pydantic default of the class
named beside it. Nothing here is computed by the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stagewise.data.rl_curriculum import CurriculumConfig
from stagewise.data.rl_rows import RLRow, read_rows
from stagewise.data.rl_sampler import CurriculumSampler
from stagewise.engines.config import EngineEnv, LaunchConfig, Parallelism
from stagewise.engines.nemo_rl import translate as nemo_rl
from stagewise.eval.rewards import RewardConfig
from stagewise.model.config import OptimizerConfig, ScheduleConfig
from stagewise.model.objectives.grpo import GRPOConfig
from stagewise.model.rl_batches import PlateauRule, RolloutSettings, SamplingSettings
from stagewise.recipe.blocks.distill import DistillStage, TeacherSpec
from stagewise.recipe.blocks.rl import RLData, RLSource, RLStage

IMAGE = EngineEnv(image="nvcr.io/nvidia/nemo-rl:v0.6.0")
DATA = RLData(sources=[RLSource(name="math", path="rl_math.jsonl")])
OPAQUE = {"on_policy_distillation.teacher_model_by_agent_name"}  # free-form keys (agent aliases)

# examples/nemo_gym/grpo_nanov3.yaml, config_paths as listed there
GYM_PATHS = [
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
    "resources_servers/math_with_judge/configs/math_with_judge.yaml",
    "resources_servers/code_gen/configs/code_gen.yaml",
    "resources_servers/workplace_assistant/configs/workplace_assistant.yaml",
    "resources_servers/mcqa/configs/mcqa.yaml",
    "resources_servers/instruction_following/configs/instruction_following.yaml",
    "resources_servers/structured_outputs/configs/structured_outputs_json.yaml",
]


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and key not in OPAQUE:
            out.update(flat(v, key + "."))
        else:
            out[key] = v
    return out


def check_against(ours: dict, same: dict, differ: dict) -> None:
    """Every key we set is in `same` (equal to upstream's value) or `differ` (upstream, ours, why)."""
    got = flat(ours)
    assert set(got) - {"defaults"} == set(same) | set(differ), (
        f"keys without an expected value: {sorted(set(got) - set(same) - set(differ) - {'defaults'})}; "
        f"expected but not set: {sorted((set(same) | set(differ)) - set(got))}")
    # 0 == 0.0 passes, True for 1 does not
    wrong = {k: (got[k], v) for k, v in same.items() if got[k] != v or isinstance(got[k], bool) != isinstance(v, bool)}
    assert not wrong, f"ours != upstream: {wrong}"
    for k, (upstream, mine, _why) in differ.items():
        assert got[k] == mine, (k, got[k], mine)
        assert upstream != mine, f"{k} is listed as a difference but equals upstream's {upstream!r}"


# ---------------------------------------------------------------------------------------------
# GRPO against examples/nemo_gym/grpo_nanov3.yaml (Nemotron 3 Nano, NeMo Gym; our configs' base)

NANOV3_SAME = {
    "grpo.num_prompts_per_step": 128,
    "grpo.num_generations_per_prompt": 16,
    "grpo.max_num_steps": 1000000,
    "grpo.max_num_epochs": 1,
    "grpo.max_rollout_turns": 1,
    "grpo.seed": 42,
    "grpo.normalize_rewards": True,
    "grpo.use_leave_one_out_baseline": True,
    "grpo.val_at_start": False,
    "grpo.async_grpo.enabled": False,
    "grpo.async_grpo.max_trajectory_age_steps": 1,
    "grpo.async_grpo.in_flight_weight_updates": False,  # grpo.py AsyncGRPOConfig default
    "grpo.dynamic_sampling_max_gen_batches": 10,  # grpo.py GRPOConfig default
    "grpo.batch_multiplier": 1,
    "grpo.reward_shaping.enabled": False,
    "grpo.reward_scaling.enabled": False,
    "grpo.adv_estimator.name": "grpo",  # advantage_estimator.py AdvEstimatorConfig defaults
    "grpo.adv_estimator.normalize_rewards": True,
    "grpo.adv_estimator.use_leave_one_out_baseline": True,
    "loss_fn.reference_policy_kl_penalty": 0,
    "loss_fn.reference_policy_kl_type": "k3",
    "loss_fn.kl_input_clamp_value": None,
    "loss_fn.kl_output_clamp_value": None,
    "loss_fn.ratio_clip_min": 0.2,
    "loss_fn.ratio_clip_max": 0.28,
    "loss_fn.ratio_clip_c": None,
    "loss_fn.use_importance_sampling_correction": True,
    "loss_fn.sequence_level_importance_ratios": False,
    "loss_fn.token_level_loss": True,
    "loss_fn.disable_ppo_ratio": False,  # loss_functions.py ClippedPGLossConfig defaults
    "loss_fn.force_on_policy_ratio": False,
    "loss_fn.use_cispo": False,
    "loss_fn.use_kl_in_reward": False,
    "checkpointing.enabled": True,
    "checkpointing.save_period": 10,
    "policy.model_name": "/path/to/hf_checkpoint",
    "policy.tokenizer.name": "/path/to/hf_checkpoint",  # ${policy.model_name}
    "policy.train_global_batch_size": 2048,
    "policy.train_micro_batch_size": 1,
    "policy.logprob_batch_size": 1,
    "policy.max_total_sequence_length": 49152,
    "policy.precision": "bfloat16",
    "policy.max_grad_norm": 1.0,
    "policy.dtensor_cfg.enabled": False,
    "policy.megatron_cfg.enabled": True,
    "policy.megatron_cfg.tensor_model_parallel_size": 2,
    "policy.megatron_cfg.expert_tensor_parallel_size": 1,
    "policy.megatron_cfg.expert_model_parallel_size": 8,
    "policy.megatron_cfg.pipeline_model_parallel_size": 2,
    "policy.megatron_cfg.context_parallel_size": 4,
    "policy.megatron_cfg.sequence_parallel": True,
    "policy.megatron_cfg.optimizer.optimizer": "adam",
    "policy.megatron_cfg.optimizer.lr": 3e-6,
    "policy.megatron_cfg.optimizer.min_lr": 3e-6,
    "policy.megatron_cfg.optimizer.weight_decay": 0.0,
    "policy.megatron_cfg.optimizer.adam_beta1": 0.9,
    "policy.megatron_cfg.optimizer.adam_beta2": 0.999,
    "policy.megatron_cfg.optimizer.adam_eps": 1e-8,
    "policy.megatron_cfg.optimizer.bf16": True,
    "policy.megatron_cfg.scheduler.lr_decay_style": "constant",
    "policy.megatron_cfg.scheduler.lr_warmup_iters": 10,
    "policy.generation.temperature": 1.0,
    "policy.generation.top_p": 1.0,
    "policy.generation.top_k": None,
    "data.shuffle": False,
    "data.train.data_path": "/path/to/train.jsonl",
    "data.validation.data_path": "/path/to/validation.jsonl",
    "data.default.dataset_name": "NemoGymDataset",
    "data.default.env_name": "nemo_gym",
    "data.default.prompt_file": None,
    "data.default.system_prompt_file": None,
    "data.default.processor": "nemo_gym_data_processor",
    "env.should_use_nemo_gym": True,
    "env.nemo_gym.config_paths": GYM_PATHS,
    "logger.wandb_enabled": False,
    "logger.tensorboard_enabled": False,
    "logger.swanlab_enabled": False,
    "logger.mlflow.experiment_name": "grpo-dev",
    "logger.mlflow.run_name": "grpo-dev-logger",
    "cluster.gpus_per_node": 8,
    "cluster.num_nodes": 32,
}

NANOV3_DIFFER = {  # key: (upstream, ours, why ours differs)
    "grpo.overlong_filtering": (True, False, "ours scores a cut response like any other"),
    "grpo.seq_logprob_error_threshold": (2, None, "ours masks tokens by the IS band, never whole sequences"),
    "grpo.val_period": (5, 0, "the stage scores held-out pass@1 itself, before and after"),
    "grpo.val_at_end": (False, True, "held-out rows given: NeMo RL scores them once at the end too"),
    "grpo.use_dynamic_sampling": (False, True, "ours drops groups whose rewards all agree"),
    "loss_fn.use_on_policy_kl_approximation": (True, False, "our k3 is not IS-weighted"),
    "loss_fn.truncated_importance_sampling_type": (None, "icepop", "our masked IS band"),  # ClippedPGLossConfig default
    "loss_fn.truncated_importance_sampling_ratio": (None, 5.0, "is_high"),
    "loss_fn.truncated_importance_sampling_ratio_min": (None, 0.5, "is_low"),  # ClippedPGLossConfig default
    "checkpointing.checkpoint_dir": ("results/grpo", "/runs/rl/checkpoints", "under the stage's run dir"),
    "checkpointing.metric_name": ("val:total_reward/mean", None, "no in-run validation metric"),
    "policy.megatron_cfg.scheduler.lr_warmup_init": (3.0e-7, 0.0, "our warmup starts from 0"),
    "policy.generation.max_new_tokens": (49152, 48128, "ours budgets prompt + response in the sequence"),
    "logger.log_dir": ("logs", "/runs/rl/logs", "under the stage's run dir"),
    "logger.mlflow_enabled": (False, True, "our tracker is MLflow"),
}

NANOV3_LAUNCH = LaunchConfig(env=IMAGE, nodes=32, gpus_per_node=8,
                             parallel=Parallelism(tp=2, pp=2, cp=4, ep=8, etp=1, sequence_parallel=True))
PROMPT, NEW = 1024, 48128  # 49152 in all


def nanov3_stage(**kw) -> RLStage:
    fields = dict(
        data=DATA, steps=1000000, prompts_per_step=128, micro_batch=1, checkpoint_every_steps=10, precision="bf16",
        rollout=RolloutSettings(group_size=16, max_new_tokens=NEW, temperature=1.0, off_policy=False,
                                scale_by_std=True, max_refills=9),
        grpo=GRPOConfig(eps_low=0.2, eps_high=0.28, is_low=0.5, is_high=5.0, kl_coeff=0.0),
        optimizer=OptimizerConfig(lr=3e-6, min_lr=3e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, grad_clip=1.0),
        schedule=ScheduleConfig(kind="constant", warmup_tokens=10 * 128 * 16 * (PROMPT + NEW)))
    return RLStage(**{**fields, **kw})


def nanov3_config(stage: RLStage | None = None, **kw) -> dict:
    args = dict(model="/path/to/hf_checkpoint", launch=NANOV3_LAUNCH, run_dir="/runs/rl",
                train_path="/path/to/train.jsonl", val_path="/path/to/validation.jsonl", gym_config_paths=GYM_PATHS,
                max_prompt_tokens=PROMPT, mlflow=nemo_rl.MlflowTarget("grpo-dev", "grpo-dev-logger"), seed=42)
    return nemo_rl.grpo_config(stage or nanov3_stage(), **{**args, **kw})


def test_grpo_matches_nemotron_nano_gym_example():
    cfg = nanov3_config()
    assert cfg["defaults"] == "/opt/nemo-rl/examples/nemo_gym/grpo_nanov3.yaml"
    assert list(cfg)[0] == "defaults"
    check_against(cfg, NANOV3_SAME, NANOV3_DIFFER)


def test_off_policy_is_async_grpo_without_dynamic_sampling():
    stage = nanov3_stage(rollout=RolloutSettings(group_size=16, max_new_tokens=NEW, off_policy=True))
    got = flat(nanov3_config(stage))
    assert got["grpo.async_grpo.enabled"] is True
    assert got["grpo.async_grpo.max_trajectory_age_steps"] == 1
    assert got["grpo.async_grpo.in_flight_weight_updates"] is False
    assert got["grpo.use_dynamic_sampling"] is False  # examples/nemo_gym/run_grpo_nemo_gym.py refuses it with async
    assert got["loss_fn.use_importance_sampling_correction"] is True  # async_grpo_train asserts it
    assert got["grpo.normalize_rewards"] is False and got["grpo.adv_estimator.normalize_rewards"] is False


# ---------------------------------------------------------------------------------------------
# GRPO against examples/configs/recipes/llm/grpo-nanov3-30BA3B-2n8g-megatron-pack-cp.yaml over
# examples/configs/grpo_math_1B.yaml (the 2n8g Megatron Nemotron 3 Nano recipe; the commit has no
# grpo-nanov3-30BA3B-2n8g-megatron.yaml). Keys about batch, parallel sizes, optimizer, loss, cluster.

PACK_CP = {
    "grpo.num_prompts_per_step": 2,
    "grpo.num_generations_per_prompt": 8,
    "grpo.max_num_steps": 1000000,
    "grpo.normalize_rewards": True,
    "grpo.use_leave_one_out_baseline": True,
    "grpo.adv_estimator.name": "grpo",
    "grpo.adv_estimator.normalize_rewards": True,  # ${grpo.normalize_rewards}
    "grpo.adv_estimator.use_leave_one_out_baseline": True,
    "grpo.overlong_filtering": False,
    "grpo.seq_logprob_error_threshold": None,
    "grpo.async_grpo.enabled": False,
    "grpo.async_grpo.max_trajectory_age_steps": 1,
    "grpo.async_grpo.in_flight_weight_updates": False,
    "grpo.val_at_start": False,
    "grpo.val_at_end": False,
    "grpo.seed": 42,
    "loss_fn.reference_policy_kl_penalty": 0.01,
    "loss_fn.reference_policy_kl_type": "k3",
    "loss_fn.ratio_clip_min": 0.2,
    "loss_fn.ratio_clip_max": 0.2,
    "loss_fn.ratio_clip_c": None,
    "loss_fn.token_level_loss": True,
    "loss_fn.sequence_level_importance_ratios": False,
    "loss_fn.use_on_policy_kl_approximation": False,
    "checkpointing.save_period": 10,
    "policy.model_name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-Base-BF16",
    "policy.tokenizer.name": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "policy.train_global_batch_size": 16,
    "policy.train_micro_batch_size": 1,
    "policy.logprob_batch_size": 1,
    "policy.max_total_sequence_length": 8192,
    "policy.precision": "bfloat16",
    "policy.max_grad_norm": 1.0,
    "policy.dtensor_cfg.enabled": False,
    "policy.megatron_cfg.enabled": True,
    "policy.megatron_cfg.tensor_model_parallel_size": 2,
    "policy.megatron_cfg.pipeline_model_parallel_size": 2,
    "policy.megatron_cfg.context_parallel_size": 2,
    "policy.megatron_cfg.expert_model_parallel_size": 8,
    "policy.megatron_cfg.sequence_parallel": True,
    "policy.megatron_cfg.optimizer.lr": 5.0e-6,
    "policy.megatron_cfg.optimizer.min_lr": 5.0e-7,
    "policy.megatron_cfg.optimizer.weight_decay": 0.01,
    "policy.megatron_cfg.optimizer.adam_beta1": 0.9,
    "policy.megatron_cfg.optimizer.adam_beta2": 0.999,
    "policy.megatron_cfg.optimizer.adam_eps": 1e-8,
    "policy.megatron_cfg.scheduler.lr_decay_style": "constant",
    "policy.megatron_cfg.scheduler.lr_warmup_iters": 13,
    "policy.generation.temperature": 1.0,
    "policy.generation.top_p": 1.0,
    "policy.generation.top_k": None,
    "cluster.gpus_per_node": 8,
    "cluster.num_nodes": 2,
}


def pack_cp_stage() -> RLStage:
    return RLStage(
        data=DATA, steps=1000000, prompts_per_step=2, micro_batch=1, checkpoint_every_steps=10,
        rollout=RolloutSettings(group_size=8, max_new_tokens=7168, off_policy=False, scale_by_std=True),
        grpo=GRPOConfig(eps_low=0.2, eps_high=0.2, kl_coeff=0.01),
        optimizer=OptimizerConfig(lr=5e-6, min_lr=5e-7, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
        schedule=ScheduleConfig(kind="constant", warmup_tokens=13 * 2 * 8 * 8192))


def test_grpo_matches_nemotron_nano_2n8g_megatron_recipe():
    launch = LaunchConfig(env=IMAGE, nodes=2, gpus_per_node=8,
                          parallel=Parallelism(tp=2, pp=2, cp=2, ep=8, sequence_parallel=True))
    cfg = nemo_rl.grpo_config(pack_cp_stage(), model="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-Base-BF16",
                              tokenizer="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", launch=launch, run_dir="/r",
                              train_path="/r/rows.jsonl", gym_config_paths=GYM_PATHS[1:2], max_prompt_tokens=1024,
                              mlflow=nemo_rl.MlflowTarget("e", "r"))
    got = flat(cfg)
    wrong = {k: (got.get(k, "<unset>"), v) for k, v in PACK_CP.items() if got.get(k, "<unset>") != v}
    assert not wrong, wrong
    assert "policy.megatron_cfg.expert_tensor_parallel_size" not in got  # etp None: the base's
    assert got["env.nemo_gym.config_paths"] == GYM_PATHS[:2]  # the Gym policy server is always first
    # the parts NeMo RL expresses differently are named
    fields = [f for f, _ in nemo_rl.unsupported(pack_cp_stage(), max_prompt_tokens=1024)]
    assert fields == ["reasoning", "optimizer.weight_decay", "rollout.scale_by_std", "grpo.kl_coeff"]


# ---------------------------------------------------------------------------------------------
# MOPD against examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml over
# examples/configs/grpo_math_1B.yaml (the reference MOPD recipe of docs/about/algorithms/mopd.md)

MOPD_SAME = {
    "grpo.num_prompts_per_step": 8,
    "grpo.num_generations_per_prompt": 4,
    "grpo.max_num_steps": 5,
    "grpo.max_num_epochs": 1,
    "grpo.max_rollout_turns": 1,
    "grpo.seed": 42,
    "grpo.val_at_start": False,
    "grpo.async_grpo.enabled": True,
    "grpo.async_grpo.max_trajectory_age_steps": 1,
    "grpo.async_grpo.in_flight_weight_updates": False,
    "grpo.adv_estimator.name": "opd",
    "grpo.use_dynamic_sampling": False,
    "loss_fn.reference_policy_kl_penalty": 0.0,
    "loss_fn.reference_policy_kl_type": "k3",
    "loss_fn.kl_input_clamp_value": None,
    "loss_fn.kl_output_clamp_value": None,
    "loss_fn.ratio_clip_min": 0.2,
    "loss_fn.ratio_clip_max": 0.28,
    "loss_fn.ratio_clip_c": None,
    "loss_fn.disable_ppo_ratio": True,
    "loss_fn.use_importance_sampling_correction": True,
    "loss_fn.truncated_importance_sampling_ratio": 5.0,
    "loss_fn.truncated_importance_sampling_ratio_min": 0.2,
    "loss_fn.truncated_importance_sampling_type": "icepop",
    "loss_fn.sequence_level_importance_ratios": False,
    "loss_fn.token_level_loss": True,
    "loss_fn.force_on_policy_ratio": False,
    "loss_fn.use_cispo": False,
    "loss_fn.use_kl_in_reward": False,
    "checkpointing.save_period": 1000,
    "policy.model_name": "Qwen/Qwen3-1.7B",
    "policy.tokenizer.name": "Qwen/Qwen3-1.7B",
    "policy.train_global_batch_size": 32,
    "policy.train_micro_batch_size": 1,
    "policy.logprob_batch_size": 1,
    "policy.max_total_sequence_length": 32768,
    "policy.precision": "bfloat16",
    "policy.max_grad_norm": 1.0,
    "policy.dtensor_cfg.enabled": False,
    "policy.megatron_cfg.enabled": True,
    "policy.megatron_cfg.tensor_model_parallel_size": 2,
    "policy.megatron_cfg.pipeline_model_parallel_size": 1,
    "policy.megatron_cfg.context_parallel_size": 1,
    "policy.megatron_cfg.expert_model_parallel_size": 1,
    "policy.megatron_cfg.sequence_parallel": True,
    "policy.megatron_cfg.optimizer.optimizer": "adam",
    "policy.megatron_cfg.optimizer.lr": 3.0e-6,
    "policy.megatron_cfg.optimizer.min_lr": 3.0e-6,
    "policy.megatron_cfg.optimizer.weight_decay": 0.0,
    "policy.megatron_cfg.optimizer.adam_beta1": 0.9,
    "policy.megatron_cfg.optimizer.adam_beta2": 0.999,
    "policy.megatron_cfg.optimizer.adam_eps": 1e-8,
    "policy.megatron_cfg.optimizer.bf16": True,
    "policy.megatron_cfg.scheduler.lr_decay_style": "constant",
    "policy.megatron_cfg.scheduler.lr_warmup_iters": 10,
    "policy.generation.max_new_tokens": 2048,
    "policy.generation.temperature": 1.0,
    "policy.generation.top_p": 1.0,
    "policy.generation.top_k": None,
    "data.train.data_path": "${oc.env:HF_HOME}/nanov3_data/train-split.jsonl",
    "data.validation.data_path": "${oc.env:HF_HOME}/nanov3_data/val-split.jsonl",
    "data.default.dataset_name": "NemoGymDataset",
    "data.default.env_name": "nemo_gym",
    "data.default.prompt_file": None,
    "data.default.system_prompt_file": None,
    "data.default.processor": "nemo_gym_data_processor",
    "env.should_use_nemo_gym": True,
    "env.nemo_gym.config_paths": GYM_PATHS,
    "logger.wandb_enabled": False,
    "logger.swanlab_enabled": False,
    "logger.mlflow.experiment_name": "mopd",
    "logger.mlflow.run_name": "mopd-qwen3-1.7b-3n8g-megatron-pack",
    "logger.mlflow.tracking_uri": "http://localhost:5000",
    "cluster.gpus_per_node": 8,
    "cluster.num_nodes": 3,
    "on_policy_distillation.enabled": True,
    "on_policy_distillation.teacher_model_by_agent_name": {"default_teacher": "Qwen/Qwen3-1.7B"},
    "on_policy_distillation.default_teacher_alias": "default_teacher",
    "on_policy_distillation.strict_agent_name_match": False,
    "on_policy_distillation.deduplicate_shared_teacher_checkpoints": True,
    "on_policy_distillation.non_colocated_teachers.enabled": True,
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.tensor_model_parallel_size": 2,
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.pipeline_model_parallel_size": 1,
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.context_parallel_size": 1,
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.expert_model_parallel_size": 1,  # opd.py default
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.num_nodes": 1,
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.gpus_per_node": 8,
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.precision": "bf16",
    "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.micro_batch_size": 1,
}

MOPD_DIFFER = {
    "grpo.overlong_filtering": (True, False, "ours trains on cut responses"),
    "grpo.seq_logprob_error_threshold": (2.0, None, "ours masks tokens, never whole sequences"),
    "grpo.val_period": (1000, 0, "the stage scores held-out pass@1 itself"),
    "grpo.val_at_end": (False, True, "held-out rows given"),
    "loss_fn.use_on_policy_kl_approximation": (True, False, "no KL in distillation; ours is not IS-weighted"),
    "checkpointing.enabled": (False, True, "ours always keeps the end checkpoint"),
    "checkpointing.checkpoint_dir": ("results/mopd-qwen3-1.7b-3n8g-megatron-pack", "/runs/distill/checkpoints",
                                     "under the stage's run dir"),
    "checkpointing.metric_name": ("val:total_reward/mean", None, "no in-run validation metric"),
    "policy.megatron_cfg.scheduler.lr_warmup_init": (3.0e-7, 0.0, "our warmup starts from 0"),
    "data.shuffle": (True, False, "rows are in step order"),  # grpo_math_1B.yaml
    "logger.log_dir": ("logs", "/runs/distill/logs", "under the stage's run dir"),
    "logger.mlflow_enabled": (False, True, "our tracker is MLflow"),
    "logger.tensorboard_enabled": (True, False, "MLflow only"),
}


def mopd_stage(**kw) -> DistillStage:
    fields = dict(
        teachers=[TeacherSpec(name="default_teacher", domains=["math"], checkpoint="/teachers/qwen3-1.7b")],
        default_teacher="default_teacher", steps=5, prompts_per_step=8, micro_batch=1, checkpoint_every_steps=1000,
        rollout=SamplingSettings(group_size=4, max_new_tokens=2048, temperature=1.0, off_policy=True),
        loss=GRPOConfig(eps_low=0.2, eps_high=0.28, is_low=0.2, is_high=5.0),
        optimizer=OptimizerConfig(lr=3e-6, min_lr=3e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
        schedule=ScheduleConfig(kind="constant", warmup_tokens=10 * 8 * 4 * 32768))
    return DistillStage(**{**fields, **kw})


MOPD_LAUNCH = LaunchConfig(env=IMAGE, nodes=3, gpus_per_node=8, parallel=Parallelism(tp=2, sequence_parallel=True))


def mopd_config(stage: DistillStage | None = None, **kw) -> dict:
    args = dict(
        model="Qwen/Qwen3-1.7B", teacher_models={"default_teacher": "Qwen/Qwen3-1.7B"},
        agents={"math": "math_with_judge_simple_agent"}, launch=MOPD_LAUNCH, run_dir="/runs/distill",
        train_path="${oc.env:HF_HOME}/nanov3_data/train-split.jsonl",
        val_path="${oc.env:HF_HOME}/nanov3_data/val-split.jsonl", gym_config_paths=GYM_PATHS,
        max_prompt_tokens=32768 - 2048,
        mlflow=nemo_rl.MlflowTarget("mopd", "mopd-qwen3-1.7b-3n8g-megatron-pack", "http://localhost:5000"))
    return nemo_rl.distill_config(stage or mopd_stage(), **{**args, **kw})


def test_distill_matches_mopd_example():
    cfg = mopd_config()
    assert cfg["defaults"] == "/opt/nemo-rl/examples/nemo_gym/grpo_nanov3.yaml"
    check_against(cfg, MOPD_SAME, MOPD_DIFFER)


def test_teacher_routes_by_gym_agent():
    stage = mopd_stage(teachers=[TeacherSpec(name="mathT", domains=["arith", "algebra"], checkpoint="/a"),
                                 TeacherSpec(name="fmtT", domains=["format"], checkpoint="/b")],
                       default_teacher="fmtT")
    models = {"mathT": "/hf/math", "fmtT": "/hf/fmt"}
    agents = {"arith": "math_agent", "algebra": "math_agent", "format": "format_agent"}
    assert nemo_rl.teacher_routes(stage, models, agents) == ({"fmtT": "/hf/fmt", "math_agent": "/hf/math"}, "fmtT")
    no_default = mopd_stage(teachers=stage.teachers, default_teacher=None)
    by_alias, alias = nemo_rl.teacher_routes(no_default, models, agents)
    assert by_alias == {"math_agent": "/hf/math", "format_agent": "/hf/fmt"} and alias is None
    cfg = mopd_config(no_default, teacher_models=models, agents=agents,
                      launch=LaunchConfig(env=IMAGE, nodes=3, gpus_per_node=8))
    assert cfg["on_policy_distillation"]["strict_agent_name_match"] is True  # ours: no route is an error
    with pytest.raises(ValueError, match="two teachers"):
        nemo_rl.teacher_routes(stage, models, {**agents, "format": "math_agent"})
    with pytest.raises(ValueError, match="no NeMo Gym agent"):
        nemo_rl.teacher_routes(stage, models, {"arith": "math_agent"})
    with pytest.raises(ValueError, match="no HF directory"):
        nemo_rl.teacher_routes(stage, {"mathT": "/hf/math"}, agents)
    with pytest.raises(ValueError, match="no node"):  # two teachers x 1 node + the student > 2 nodes
        mopd_config(no_default, teacher_models=models, agents=agents,
                    launch=LaunchConfig(env=IMAGE, nodes=2, gpus_per_node=8))


# ---------------------------------------------------------------------------------------------
# every key we write exists in NeMo RL's schema

# Transcribed key paths: the YAMLs named above (grpo_math_1B.yaml, nemo_gym/grpo_nanov3.yaml,
# mopd-qwen3-1.7b-3n8g-megatron-pack.yaml) and the classes nemo_rl/algorithms/grpo.py GRPOConfig /
# AsyncGRPOConfig, loss/loss_functions.py ClippedPGLossConfig, advantage_estimator.py AdvEstimatorConfig,
# opd.py OnPolicyDistillationConfig / TeacherResourceConfig, models/policy/__init__.py PolicyConfig /
# MegatronConfig / MegatronOptimizerConfig / MegatronSchedulerConfig, utils/checkpoint.py
# CheckpointingConfig, utils/logger.py LoggerConfig / MLflowConfig, data/__init__.py DataConfig /
# ResponseDatasetConfig.
UPSTREAM_KEYS = set("""
defaults
grpo.num_prompts_per_step grpo.num_generations_per_prompt grpo.max_num_steps grpo.max_num_epochs
grpo.max_rollout_turns grpo.seed grpo.normalize_rewards grpo.use_leave_one_out_baseline grpo.overlong_filtering
grpo.seq_logprob_error_threshold grpo.val_period grpo.val_at_start grpo.val_at_end grpo.use_dynamic_sampling
grpo.dynamic_sampling_max_gen_batches grpo.batch_multiplier grpo.reward_shaping.enabled grpo.reward_scaling.enabled
grpo.async_grpo.enabled grpo.async_grpo.max_trajectory_age_steps grpo.async_grpo.in_flight_weight_updates
grpo.adv_estimator.name grpo.adv_estimator.normalize_rewards grpo.adv_estimator.use_leave_one_out_baseline
loss_fn.ratio_clip_min loss_fn.ratio_clip_max loss_fn.ratio_clip_c loss_fn.disable_ppo_ratio
loss_fn.force_on_policy_ratio loss_fn.use_cispo loss_fn.reference_policy_kl_penalty loss_fn.reference_policy_kl_type
loss_fn.kl_input_clamp_value loss_fn.kl_output_clamp_value loss_fn.use_kl_in_reward
loss_fn.use_on_policy_kl_approximation loss_fn.use_importance_sampling_correction
loss_fn.truncated_importance_sampling_type loss_fn.truncated_importance_sampling_ratio
loss_fn.truncated_importance_sampling_ratio_min loss_fn.sequence_level_importance_ratios loss_fn.token_level_loss
policy.model_name policy.tokenizer.name policy.train_global_batch_size policy.train_micro_batch_size
policy.logprob_batch_size policy.max_total_sequence_length policy.precision policy.max_grad_norm
policy.dtensor_cfg.enabled policy.megatron_cfg.enabled policy.megatron_cfg.tensor_model_parallel_size
policy.megatron_cfg.pipeline_model_parallel_size policy.megatron_cfg.context_parallel_size
policy.megatron_cfg.expert_model_parallel_size policy.megatron_cfg.expert_tensor_parallel_size
policy.megatron_cfg.sequence_parallel policy.megatron_cfg.optimizer.optimizer policy.megatron_cfg.optimizer.lr
policy.megatron_cfg.optimizer.min_lr policy.megatron_cfg.optimizer.weight_decay
policy.megatron_cfg.optimizer.adam_beta1 policy.megatron_cfg.optimizer.adam_beta2
policy.megatron_cfg.optimizer.adam_eps policy.megatron_cfg.optimizer.bf16
policy.megatron_cfg.scheduler.lr_decay_style policy.megatron_cfg.scheduler.lr_decay_iters
policy.megatron_cfg.scheduler.lr_warmup_iters policy.megatron_cfg.scheduler.lr_warmup_init
policy.generation.temperature policy.generation.top_p policy.generation.top_k policy.generation.max_new_tokens
checkpointing.enabled checkpointing.checkpoint_dir checkpointing.save_period checkpointing.metric_name
logger.log_dir logger.mlflow_enabled logger.wandb_enabled logger.tensorboard_enabled logger.swanlab_enabled
logger.mlflow.experiment_name logger.mlflow.run_name logger.mlflow.tracking_uri logger.mlflow.run_id
cluster.num_nodes cluster.gpus_per_node
data.shuffle data.train.data_path data.validation data.validation.data_path data.default.dataset_name
data.default.env_name data.default.prompt_file data.default.system_prompt_file data.default.processor
env.should_use_nemo_gym env.nemo_gym.config_paths
on_policy_distillation.enabled on_policy_distillation.teacher_model_by_agent_name
on_policy_distillation.default_teacher_alias on_policy_distillation.strict_agent_name_match
on_policy_distillation.deduplicate_shared_teacher_checkpoints on_policy_distillation.non_colocated_teachers.enabled
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.tensor_model_parallel_size
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.pipeline_model_parallel_size
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.context_parallel_size
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.expert_model_parallel_size
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.num_nodes
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.gpus_per_node
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.precision
on_policy_distillation.non_colocated_teachers.default_teacher_cfg.micro_batch_size
""".split())


def test_every_key_exists_upstream():
    cosine = nanov3_stage(schedule=ScheduleConfig(kind="cosine"), precision="fp32")
    configs = [nanov3_config(cosine, val_path=None, mlflow=nemo_rl.MlflowTarget("e", "r", "sqlite:///m.db", "abc")),
               nanov3_config(), mopd_config()]
    for cfg in configs:
        assert set(flat(cfg)) <= UPSTREAM_KEYS, sorted(set(flat(cfg)) - UPSTREAM_KEYS)
    got = flat(configs[0])
    assert got["data.validation"] is None and got["grpo.val_at_end"] is False
    assert got["policy.megatron_cfg.scheduler.lr_decay_style"] == "cosine"
    assert got["policy.megatron_cfg.scheduler.lr_decay_iters"] == 1000000
    assert got["policy.precision"] == "float32" and got["policy.megatron_cfg.optimizer.bf16"] is False
    assert got["logger.mlflow.run_id"] == "abc" and got["logger.mlflow.tracking_uri"] == "sqlite:///m.db"


def test_defaults_follow_the_environment_workdir():
    launch = LaunchConfig(env=EngineEnv(venv="/envs/nemo-rl", workdir="/src/RL"), nodes=32, gpus_per_node=8,
                          parallel=NANOV3_LAUNCH.parallel)
    assert nanov3_config(launch=launch)["defaults"] == "/src/RL/examples/nemo_gym/grpo_nanov3.yaml"


# ---------------------------------------------------------------------------------------------
# what stays on our engine

TINY_ENVS = ["exact_answer", "json_answer", "uppercase", "calculator", "sorting"]


def test_unsupported_for_a_default_tiny_rl_block():
    stage = RLStage(data=DATA, steps=60)
    fields = [f for f, _ in nemo_rl.unsupported(stage, environments=TINY_ENVS, max_prompt_tokens=64)]
    assert fields == ["environment.calculator", "environment.exact_answer", "environment.json_answer",
                      "environment.sorting", "environment.uppercase", "reasoning", "rollout.off_policy"]
    gym = {e: f"{e}_agent" for e in TINY_ENVS}
    assert [f for f, _ in nemo_rl.unsupported(stage.model_copy(update={"reasoning": True}), environments=TINY_ENVS,
                                              gym_agents=gym)] == ["rollout.off_policy"]
    sync = stage.model_copy(update={"reasoning": True, "rollout": RolloutSettings(off_policy=False)})
    assert nemo_rl.unsupported(sync) == []
    assert all(why for _, why in nemo_rl.unsupported(stage, environments=TINY_ENVS))


def test_unsupported_names_each_feature():
    stage = RLStage(
        data=DATA, steps=60, reasoning=True, reprofile=PlateauRule(),
        rollout=RolloutSettings(off_policy=True, recompute_old_logprobs=True, scale_by_std=True),
        grpo=GRPOConfig(kl_coeff=0.05), rewards=RewardConfig(accuracy=0.5, format=0.2, length=0.1),
        optimizer=OptimizerConfig(lr=1e-5, weight_decay=0.1), schedule=ScheduleConfig(kind="wsd", warmup_tokens=1000))
    fields = [f for f, _ in nemo_rl.unsupported(stage, max_prompt_tokens=64)]
    assert fields == ["rollout.recompute_old_logprobs", "optimizer.weight_decay", "schedule.kind",
                      "schedule.warmup_tokens", "rollout.off_policy", "rollout.scale_by_std", "grpo.kl_coeff",
                      "reprofile", "rewards.accuracy", "rewards.format", "rewards.length"]
    # a warmup of whole steps converts exactly: 16 prompts x 8 x (64 + 16) tokens = 10240 per step
    whole = stage.model_copy(update={"schedule": ScheduleConfig(kind="constant", warmup_tokens=3 * 10240)})
    assert "schedule.warmup_tokens" not in [f for f, _ in nemo_rl.unsupported(whole, max_prompt_tokens=64)]


def test_unsupported_distill():
    stage = DistillStage(teachers=[TeacherSpec(name="t", domains=["math"], checkpoint="/c")], steps=5)
    assert [f for f, _ in nemo_rl.unsupported_distill(stage)] == ["reasoning"]
    sync = stage.model_copy(update={"discount": 0.5, "reasoning": True,
                                    "rollout": SamplingSettings(off_policy=False)})
    assert [f for f, _ in nemo_rl.unsupported_distill(sync)] == ["rollout.off_policy", "discount"]


# ---------------------------------------------------------------------------------------------
# the curriculum as ordered rows, and the entry


def _rows(n_per_domain: int) -> tuple[dict[str, RLRow], dict[str, list[tuple[str, float]]]]:
    rows, by_domain = {}, {}
    for d in ("arith", "format"):
        for k in range(n_per_domain):
            pid = f"{d}-{k}"
            obj = {"responses_create_params": {"input": f"q {pid}"}, "expected_answer": str(k), "id": pid, "domain": d}
            if d == "format":
                obj["agent_ref"] = {"type": "responses_api_agents", "name": "kept_agent"}
            rows[pid] = RLRow.model_validate(obj)
            by_domain.setdefault(d, []).append((pid, (k % 9) / 8))  # pass rates 0, 1/8, ..., 1
    return rows, by_domain


def test_ordered_rows_are_our_engines_batches_in_step_order(tmp_path):
    rows, by_domain = _rows(40)
    kw = dict(ratios={"arith": 3.0, "format": 1.0}, batch_size=8, total_steps=6, curriculum=CurriculumConfig(),
              seed=7)
    out = nemo_rl.ordered_rows(rows, by_domain, agent_of=lambda pid: f"{rows[pid].domain}_agent", **kw)
    assert len(out) == 6 * 8
    sampler = CurriculumSampler(by_domain, kw["ratios"], 8, 6, CurriculumConfig(), 7)  # what flows/rl.py trains on
    assert [str(r.id) for r in out] == [i for s in range(1, 7) for i in sampler.sample(s, 0)]
    for s in range(6):  # fixed domain counts in every step: 3:1 of 8
        assert sum(r.domain == "arith" for r in out[8 * s:8 * s + 8]) == 6
    rate = {pid: p for v in by_domain.values() for pid, p in v}
    first = sum(rate[str(r.id)] for r in out[:8]) / 8
    last = sum(rate[str(r.id)] for r in out[-8:]) / 8
    assert first > last  # easy to hard
    assert {r.as_json()["agent_ref"]["name"] for r in out if r.domain == "arith"} == {"arith_agent"}
    assert {r.as_json()["agent_ref"]["name"] for r in out if r.domain == "format"} == {"kept_agent"}
    path = nemo_rl.write_ordered_rows(tmp_path / "rl_train.jsonl", rows, by_domain, **kw)
    assert [str(r.id) for r in read_rows(path)] == [str(r.id) for r in out]
    # no curriculum: uniform per domain, still the sampler's draws
    flat_rows = nemo_rl.ordered_rows(rows, by_domain, **{**kw, "curriculum": None})
    plain = CurriculumSampler(by_domain, kw["ratios"], 8, 6, None, 7)
    assert [str(r.id) for r in flat_rows] == [i for s in range(1, 7) for i in plain.sample(s, 0)]


def test_argv_and_written_config(tmp_path):
    assert nemo_rl.argv("/runs/rl/grpo.yaml") == [
        "python", "examples/nemo_gym/run_grpo_nemo_gym.py", "--config", "/runs/rl/grpo.yaml"]
    assert nemo_rl.argv("/c.yaml", {"grpo.max_num_steps": 3, "checkpointing.metric_name": None,
                                   "grpo.val_at_end": False}) == [
        "python", "examples/nemo_gym/run_grpo_nemo_gym.py", "--config", "/c.yaml",
        "grpo.max_num_steps=3", "checkpointing.metric_name=null", "grpo.val_at_end=false"]
    path = nemo_rl.write_config(nanov3_config(), tmp_path / "grpo.yaml")
    text = path.read_text()
    assert text.startswith("defaults: /opt/nemo-rl/examples/nemo_gym/grpo_nanov3.yaml\n")
    assert yaml.safe_load(text) == nanov3_config()


def test_micro_batch_divides_the_step():
    stage = nanov3_stage(micro_batch=48)  # 2048 rows per step: gcd 16, as our engine trains
    got = flat(nanov3_config(stage))
    assert got["policy.train_micro_batch_size"] == 16


def test_spare_batches_follow_the_steps_as_refills_of_the_last():
    rows, by_domain = _rows(40)
    kw = dict(ratios={"arith": 1.0, "format": 1.0}, batch_size=4, total_steps=3, curriculum=CurriculumConfig(), seed=2)
    plain = nemo_rl.ordered_rows(rows, by_domain, **kw)
    spared = nemo_rl.ordered_rows(rows, by_domain, spare_batches=2, **kw)
    sampler = CurriculumSampler(by_domain, kw["ratios"], 4, 3, CurriculumConfig(), 2)
    assert [str(r.id) for r in spared[:12]] == [str(r.id) for r in plain]  # the steps' own rows first, unchanged
    assert [str(r.id) for r in spared[12:]] == sampler.sample(3, 1) + sampler.sample(3, 2)


def test_rows_reach_nemo_gym_with_responses_api_tools():
    """NeMo Gym validates `responses_create_params.tools` as Responses-API tools (flat function tools,
    name/parameters/strict required): our Chat-Completions definitions are flattened, others kept."""
    from stagewise.data.world.calculator import TOOL

    flat = {"type": "function", "name": "lookup", "parameters": None, "strict": True}
    row = RLRow.model_validate({"id": "c-0", "responses_create_params": {"input": "q", "tools": [TOOL, flat]},
                                "expected_answer": 3, "expression": "1 + 2"})
    got = nemo_rl.gym_row(row, "calc_agent").as_json()
    fn = TOOL["function"]
    assert got["responses_create_params"]["tools"] == [
        {"type": "function", "name": "calculator", "description": fn["description"], "parameters": fn["parameters"],
         "strict": False}, flat]
    assert got["agent_ref"] == {"type": "responses_api_agents", "name": "calc_agent"}
    assert {k: got[k] for k in ("id", "expected_answer", "expression")} == {"id": "c-0", "expected_answer": 3,
                                                                          "expression": "1 + 2"}
    assert row.as_json()["responses_create_params"]["tools"] == [TOOL, flat]  # the row itself is unchanged
    plain = RLRow.model_validate({"responses_create_params": {"input": "q"}, "agent_ref": {"name": "a"}})
    assert nemo_rl.gym_row(plain, "other") is plain  # nothing to change: the same row (its source line reused)
    no_tools = RLRow.model_validate({"responses_create_params": {"input": "q", "tools": None}})
    assert "tools" not in nemo_rl.gym_row(no_tools).as_json()["responses_create_params"]  # Gym's tools is a list


def test_an_agents_resources_server_comes_from_its_name():
    """NeMo Gym's configs name an agent after its server (resources_servers/*/configs/*.yaml in 0.7.0)."""
    assert {a: nemo_rl.gym_server(a) for a in (
        "math_with_judge_simple_agent", "string_match_simple_agent", "lc_equivalence_rule_simple_agent",
        "structured_outputs_simple_agent", "structured_outputs_v3_simple_agent", "math_with_judge",
        "math_agent", "my_math_with_judgement_agent", "mcqa_simple_agent")} == {
        "math_with_judge_simple_agent": "math_with_judge", "string_match_simple_agent": "string_match",
        "lc_equivalence_rule_simple_agent": "equivalence_rule",
        "structured_outputs_simple_agent": "structured_outputs",
        "structured_outputs_v3_simple_agent": "structured_outputs", "math_with_judge": "math_with_judge",
        "math_agent": None, "my_math_with_judgement_agent": None, "mcqa_simple_agent": None}


def _gym(row: dict, agent: str) -> dict:
    return nemo_rl.gym_row(RLRow.model_validate(row), agent).as_json()


def test_rows_carry_what_their_servers_verify_request_reads():
    """The typed servers' verify requests (GYM_SERVERS; test_real_gym_rows.py validates them with
    nemo-gym's own models): expected_answer as text (pydantic's str refuses an int), math_with_judge's
    `question`, string_match's extraction mode, structured_outputs' `schema_str`."""
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "first"},
              {"role": "assistant", "content": "ok"},
              {"role": "user", "content": [{"type": "input_text", "text": "5 x 9 = ?"}]}]
    arith = {"id": "a-0", "environment": "exact_answer", "responses_create_params": {"input": prompt},
             "expected_answer": 45}
    got = _gym(arith, "math_with_judge_simple_agent")
    assert (got["expected_answer"], got["question"]) == ("45", "5 x 9 = ?")  # the last user message
    assert got["responses_create_params"] == arith["responses_create_params"] and got["environment"] == "exact_answer"
    assert _gym({**arith, "expected_answer": -2, "responses_create_params": {"input": "1 - 3 = ?"}},
                "math_with_judge_simple_agent")["question"] == "1 - 3 = ?"
    kept = _gym({**arith, "question": "What is 5 x 9?"}, "math_with_judge_simple_agent")
    assert kept["question"] == "What is 5 x 9?"  # a row's own question is kept
    assert _gym(arith, "string_match_simple_agent") | {"agent_ref": None} == {
        **arith, "expected_answer": "45", "extraction_mode": "full_response", "agent_ref": None}
    assert _gym({**arith, "extraction_mode": "boxed"}, "string_match_simple_agent")["extraction_mode"] == "boxed"
    eq = _gym(arith, "lc_equivalence_rule_simple_agent")
    assert eq["expected_answer"] == "45" and "question" not in eq and "extraction_mode" not in eq
    sort = {**arith, "environment": "sorting", "expected_answer": [920, 85, 7]}
    assert _gym(sort, "string_match_simple_agent")["expected_answer"] == "920, 85, 7"  # order kept, as written
    assert _gym(sort, "lc_equivalence_rule_simple_agent")["expected_answer"] == "920, 85, 7"
    js = _gym({**arith, "environment": "json_answer", "expected_answer": -23}, "structured_outputs_simple_agent")
    assert js["expected_answer"] == -23 and json.loads(js["schema_str"]) == {
        "type": "object", "properties": {"answer": {"const": -23}}, "required": ["answer"],
        "additionalProperties": False}
    assert _gym(arith, "math_agent") == {**arith, "agent_ref": {"type": "responses_api_agents", "name": "math_agent"}}
    own = RLRow.model_validate({**arith, "agent_ref": {"type": "responses_api_agents",
                                                       "name": "math_with_judge_simple_agent"}})
    assert nemo_rl.gym_row(own, "math_with_judge_simple_agent") is own  # NeMo Gym's row already: kept
    assert arith["expected_answer"] == 45  # the row handed in is unchanged


def test_answers_a_server_cannot_take_are_refused():
    """math-verify reads "1, 2, 3" as a set (3, 2, 1 verifies): a list answer's order would be lost."""
    sort = {"id": "s-0", "responses_create_params": {"input": "sort 3, 1"}, "expected_answer": [1, 3]}
    with pytest.raises(ValueError, match=r"row s-0: expected_answer \[1, 3\] cannot be verified by NeMo Gym agent "
                                         r"'math_with_judge_simple_agent': math_with_judge takes one math value"):
        nemo_rl.gym_row(RLRow.model_validate(sort), "math_with_judge_simple_agent")
    for bad, agent in [({"a": 1}, "string_match_simple_agent"), (None, "lc_equivalence_rule_simple_agent"),
                       (True, "math_with_judge_simple_agent"), ([1, 2], "structured_outputs_simple_agent")]:
        with pytest.raises(ValueError, match="cannot be verified"):
            nemo_rl.gym_row(RLRow.model_validate({**sort, "expected_answer": bad}), agent)
    rows = {"s-0": RLRow.model_validate(sort)}
    with pytest.raises(ValueError, match="math_with_judge"):  # ordered_rows writes each row with gym_row
        nemo_rl.ordered_rows(rows, {"sort": [("s-0", 0.5)]}, ratios={"sort": 1.0}, batch_size=1, total_steps=1,
                             curriculum=None, seed=0, agent_of=lambda _: "math_with_judge_simple_agent")


def test_a_verifier_its_agents_server_cannot_verify_is_unsupported():
    stage = RLStage(data=DATA, steps=60, reasoning=True, rollout=RolloutSettings(off_policy=False))
    ok = {"exact_answer": "math_with_judge_simple_agent", "sorting": "string_match_simple_agent",
          "json_answer": "structured_outputs_simple_agent", "uppercase": "uppercase_agent", "calculator": "calc_agent"}
    assert nemo_rl.unsupported(stage, environments=TINY_ENVS, gym_agents=ok) == []
    bad = {"exact_answer": "structured_outputs_simple_agent", "sorting": "math_with_judge_simple_agent",
           "json_answer": "lc_equivalence_rule_simple_agent", "uppercase": "string_match_simple_agent",
           "calculator": "math_with_judge_simple_agent"}
    got = dict(nemo_rl.unsupported(stage, environments=TINY_ENVS, gym_agents=bad))
    assert sorted(got) == [f"environment.{e}" for e in sorted(TINY_ENVS)]
    assert got["environment.sorting"].startswith(
        "NeMo Gym agent 'math_with_judge_simple_agent' verifies with the math_with_judge resources server, which "
        "cannot verify our 'sorting' rows: it compares one math value")
    assert "a sorting answer's order is lost" in got["environment.sorting"]
    assert got["environment.uppercase"].endswith("it verifies exact_answer, sorting rows")
    from stagewise.engines.nemo_rl.checks import refusals

    (path, why, _), = refusals("stages.rl", [("environment.sorting", got["environment.sorting"])])
    assert path == "stages.rl.nemo_gym.agents.sorting" and why.endswith("(or use engine torch)")
    distill = DistillStage(teachers=[TeacherSpec(name="t", domains=["math"], checkpoint="/c")], steps=5,
                           reasoning=True)
    assert [f for f, _ in nemo_rl.unsupported_distill(distill, environments=["sorting"], gym_agents=bad)] == [
        "environment.sorting"]


# ---------------------------------------------------------------------------------------------
# rollout.minibatches: k optimizer updates per rollout step


def test_minibatches_are_updates_per_rollout_step():
    """grpo.py trains size // train_global_batch_size global batches per train() call, one
    optimizer step each (megatron_policy_worker.py train), and ticks the scheduler once per call."""
    one = flat(nanov3_config(nanov3_stage(steps=100, schedule=ScheduleConfig(kind="constant"),
                                          checkpoint_every_steps=10)))
    stage = nanov3_stage(steps=100, micro_batch=4096, checkpoint_every_steps=10, schedule=ScheduleConfig(kind="constant"),
                         rollout=RolloutSettings(group_size=16, max_new_tokens=NEW, off_policy=False, minibatches=4))
    got = flat(nanov3_config(stage))
    assert (one["grpo.max_num_steps"], one["policy.train_global_batch_size"]) == (100, 2048)
    assert got["grpo.max_num_steps"] == 25  # 100 optimizer steps = 25 rollout steps of 4 updates
    assert got["grpo.num_prompts_per_step"] * got["grpo.num_generations_per_prompt"] == 2048
    assert got["policy.train_global_batch_size"] == 512 and got["policy.train_micro_batch_size"] == 512
    assert got["checkpointing.save_period"] == 2 and one["checkpointing.save_period"] == 10  # every 10 updates ~ 2 steps
    assert "rollout.minibatches" not in [f for f, _ in nemo_rl.unsupported(stage)]
    cosine = stage.model_copy(update={"schedule": ScheduleConfig(kind="cosine")})
    assert flat(nanov3_config(cosine))["policy.megatron_cfg.scheduler.lr_decay_iters"] == 25  # rollout steps


def test_minibatches_nemo_rl_cannot_follow_are_named():
    ro = RolloutSettings(group_size=3, max_new_tokens=8, off_policy=False, minibatches=2)
    uneven = RLStage(data=DATA, steps=4, prompts_per_step=3, reasoning=True, rollout=ro)  # 9 rows in 2 parts
    (why,) = [w for f, w in nemo_rl.unsupported(uneven) if f == "rollout.minibatches"]
    assert "9 rows per rollout step do not split into 2" in why
    warm = RLStage(data=DATA, steps=4, prompts_per_step=4, reasoning=True, schedule=ScheduleConfig(warmup_tokens=64),
                   rollout=ro.model_copy(update={"group_size": 4}))
    (why,) = [w for f, w in nemo_rl.unsupported(warm) if f == "rollout.minibatches"]
    assert "once per rollout step" in why


# ---------------------------------------------------------------------------------------------
# the export: NeMo RL's own converters on its checkpoint layout


def test_export_converts_the_last_save_with_nemo_rls_converter():
    """examples/converters/convert_megatron_to_hf.py --config --megatron-ckpt-path --hf-ckpt-path, on
    step_<n>/policy/weights/iter_0000000 (docs/design-docs/checkpointing.md); the DTensor policy's
    convert_dcp_to_hf.py on step_<n>/policy/weights."""
    cfg = nanov3_config()
    step = "/runs/rl/checkpoints/step_1000000"
    assert nemo_rl.last_checkpoint(cfg) == Path(step)
    assert nemo_rl.export_argv(cfg, "/runs/rl/hf", image=True) == [
        "uv", "run", "--extra", "mcore", "python", "examples/converters/convert_megatron_to_hf.py",
        "--config", f"{step}/config.yaml", "--megatron-ckpt-path", f"{step}/policy/weights/iter_0000000",
        "--hf-ckpt-path", "/runs/rl/hf"]
    assert nemo_rl.export_argv(cfg, "/hf", image=False)[:2] == ["python", "examples/converters/convert_megatron_to_hf.py"]
    dtensor = {**cfg, "policy": {**cfg["policy"], "megatron_cfg": {"enabled": False}, "dtensor_cfg": {"enabled": True}}}
    assert nemo_rl.export_argv(dtensor, "/hf", image=True) == [
        "python", "examples/converters/convert_dcp_to_hf.py", "--config", f"{step}/config.yaml",
        "--dcp-ckpt-path", f"{step}/policy/weights", "--hf-ckpt-path", "/hf"]
