"""The `engine` / `launch` keys of trainable stages: which engines a stage takes, and a launch that fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
VENV = ("{env: {venv: /opt/mbridge, workdir: /opt/Megatron-Bridge}, gpus_per_node: 8, "
        "parallel: {tp: 2, cp: 2, sequence_parallel: true}}")


def problems(*sets: str) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(TINY, list(sets))
    return str(info.value)


def test_torch_is_the_default_everywhere():
    stages = load_recipe(TINY).recipe.stages
    assert {s.engine for s in (stages.pretrain, stages.long_context, stages.sft, stages.rl, stages.distill)} == {"torch"}


def test_a_launched_engine_validates_with_its_launch():
    r = load_recipe(TINY, ["stages.pretrain.engine=megatron", f"stages.pretrain.launch={VENV}"]).recipe
    assert r.stages.pretrain.launch.data_parallel == 2 and r.stages.pretrain.launch.parallel.sequence_parallel


NEMO_RL = "{env: {venv: /opt/nemo-rl/.venv, workdir: /opt/nemo-rl}, gpus_per_node: 8}"
GYM = ("{agents: {exact_answer: math_with_judge_simple_agent, json_answer: structured_outputs_simple_agent}, "
       "config_paths: [resources_servers/math_with_judge/configs/math_with_judge.yaml]}")
RL_ON_NEMO_RL = ["stages.rl.engine=nemo_rl", f"stages.rl.launch={NEMO_RL}", f"stages.rl.nemo_gym={GYM}",
                 "stages.rl.reasoning=true", "stages.rl.rollout.off_policy=false", "stages.rl.rewards={accuracy: 1.0}"]


def line_of(prefix: str) -> int:
    """The 1-based line of the shipped recipe that starts with `prefix` (the first one)."""
    return next(i for i, line in enumerate(TINY.read_text().splitlines(), 1) if line.startswith(prefix))


def test_an_rl_block_nemo_rl_can_express_validates():
    r = load_recipe(TINY, [*RL_ON_NEMO_RL, "stages.rl.rollout.minibatches=2"]).recipe
    assert r.stages.rl.engine == "nemo_rl" and r.stages.rl.nemo_gym.agents["exact_answer"]


def test_the_demo_rl_block_is_refused_on_nemo_rl_naming_each_field_at_its_line():
    text = problems("stages.rl.engine=nemo_rl", f"stages.rl.launch={NEMO_RL}")
    for field in ("nemo_gym.agents.exact_answer", "nemo_gym.agents.json_answer", "reasoning", "rewards.format"):
        assert f"stages.rl.{field}: NeMo RL cannot train this as ours does" in text, field
    assert "nemo_gym.agents.uppercase" not in text  # the world writes json_answer format rows only
    assert "stages.rl.rollout" not in text  # synchronous, 2 equal minibatches, a constant LR: NeMo RL's sync GRPO
    assert f"recipes/tiny.yaml:{line_of('    rewards: {accuracy')}" in text
    assert "stages.rl.engine: the rl stage cannot launch" not in text
    only_gym = problems(*RL_ON_NEMO_RL[:2], *RL_ON_NEMO_RL[3:])
    assert "give a Gym agent for it" in only_gym and "stages.rl.reasoning" not in only_gym
    no_checkout = problems(*RL_ON_NEMO_RL[:1], "stages.rl.launch={env: {venv: /opt/nemo-rl/.venv}}", *RL_ON_NEMO_RL[2:])
    assert "stages.rl.launch.env.workdir: set it to NeMo RL's checkout" in no_checkout


def test_distillation_on_nemo_rl_needs_a_node_per_teacher_besides_the_student():
    base = ["stages.distill.engine=nemo_rl", f"stages.distill.nemo_gym={GYM}", "stages.distill.reasoning=true",
            "stages.distill.rollout.off_policy=true"]
    text = problems(*base, f"stages.distill.launch={NEMO_RL}")
    assert "stages.distill.launch.nodes: NeMo RL cannot run this: 2 teacher(s) x 1 node(s) leave no node of 1" in text
    slurm = "{env: {image: nvcr.io/nvidia/nemo-rl:v0.6.0}, scheduler: slurm, nodes: 3, gpus_per_node: 8}"
    assert load_recipe(TINY, [*base, f"stages.distill.launch={slurm}"]).recipe.stages.distill.engine == "nemo_rl"
    sync = problems(*base[:-1], f"stages.distill.launch={slurm}")
    assert "stages.distill.rollout.off_policy: NeMo RL cannot train this as ours does" in sync


MEGATRON_LC = ["stages.long_context.engine=megatron", f"stages.long_context.launch={VENV}"]
ONE_LENGTH = "stages.long_context.data.lengths=[{length: 2048, share: 1.0}]"
MEGATRON_SFT = ["stages.sft.engine=megatron", f"stages.sft.launch={VENV}", "stages.sft.stages[0].micro_batch=1",
                "stages.sft.stages[1].micro_batch=1", "stages.sft.stages[1].normalization=token"]


def test_long_context_and_sft_on_megatron_validate_once_megatron_bridge_can_take_them():
    r = load_recipe(TINY, [*MEGATRON_LC, ONE_LENGTH, *MEGATRON_SFT]).recipe
    assert r.stages.long_context.engine == r.stages.sft.engine == "megatron"


def test_a_long_context_length_mix_is_refused_at_its_line():
    text = problems(*MEGATRON_LC)  # tiny mixes 2048, 1024 and 256
    assert "stages.long_context.data.lengths: Megatron-Bridge trains one sequence length per run" in text
    assert f"recipes/tiny.yaml:{line_of('      lengths:')}" in text


def test_each_sft_sub_stage_is_translated_and_its_refusals_named():
    text = problems("stages.sft.engine=megatron", f"stages.sft.launch={VENV}")
    assert "stages.sft.stages[0].micro_batch: Megatron-Bridge trains packed sequences with micro batch 1" in text
    assert "stages.sft.stages[1].normalization: Megatron-Bridge normalises the SFT loss per token" in text
    assert "stages.sft.stages[1].micro_batch" not in text  # stage 2 already trains micro batch 1


def test_a_sub_stage_gate_or_epoch_cap_cannot_ride_megatron():
    gate = "{suite: chat, eval_every_tokens: 32768, all: [{metric: eval/sft_dev/loss, op: '<', value: 5}]}"
    text = problems(*MEGATRON_SFT, f"stages.sft.stages[1].gate={gate}", "stages.sft.stages[0].max_epochs=2")
    assert "stages.sft.stages[1].gate: a gate that evaluates between chunks (eval_every_tokens below" in text
    assert "stages.sft.stages[0].gate" not in text  # tiny's stage-1 gate evaluates at its end: a bar on the export
    assert "stages.sft.stages[0].max_epochs: Megatron-Bridge trains the budget's steps" in text


def test_what_megatron_bridge_would_refuse_is_found_before_the_run():
    launch = "stages.pretrain.launch={env: {venv: /opt/mbridge}, gpus_per_node: 2}"
    assert "stages.pretrain.launch.env.workdir: set it to the Megatron-Bridge checkout" in problems(
        "stages.pretrain.engine=megatron", launch)
    text = problems("stages.pretrain.engine=megatron", f"stages.pretrain.launch={VENV}", "stages.pretrain.precision=fp32")
    assert "stages.pretrain.precision: the Megatron-Bridge recipes train in bf16" in text


def test_the_published_4b_recipe_translates_in_whole_steps_as_our_engine_counts_them():
    from stagewise.engines.megatron.translate import plan_megatron
    from stagewise.flows.pretrain import train_config

    recipe = TINY.parent / "nemotron-3-nano-4b.yaml"
    launch = "{env: {image: nvcr.io/nvidia/nemo:26.08, workdir: /opt/Megatron-Bridge}, nodes: 96, gpus_per_node: 8}"
    r = load_recipe(recipe, ["stages.pretrain.engine=megatron", f"stages.pretrain.launch={launch}"]).recipe
    plan = plan_megatron(train_config(r.stages.pretrain, "bf16"), r.stages.pretrain.launch, r.model,
                         stage_mode="pretrain", save_dir="/ckpt", blend=[("/data/web", 1.0)], field="stages.pretrain")
    # 20T tokens / (8192 x 768) = 3,178,914.4 steps: rounded down, as TrainConfig.total_steps does
    assert plan.train_iters == 3_178_914 == r.stages.pretrain.total_steps
    assert plan.overrides["scheduler.lr_warmup_iters"] == 31_789  # 200B tokens, to the nearest step
    assert plan.overrides["checkpoint.save_interval"] == 3_974  # 25B tokens


def test_a_gate_cannot_ride_a_launched_engine():
    text = problems("stages.pretrain.engine=megatron", f"stages.pretrain.launch={VENV}",
                    "stages.pretrain.gate={suite: chat, eval_every_tokens: 131072, all: [{metric: eval/validation/loss, op: '<', value: 5}]}")
    assert "stages.pretrain.gate: a gate evaluates between chunks" in text


@pytest.mark.parametrize("stage,engine", [("rl", "megatron"), ("distill", "megatron"), ("pretrain", "nemo_rl"),
                                          ("sft", "nemo_rl"), ("long_context", "nemo_rl")])
def test_an_engine_that_cannot_train_the_stage_is_named(stage, engine):
    text = problems(f"stages.{stage}.engine={engine}", f"stages.{stage}.launch={VENV}")
    assert f"stages.{stage}.engine: '{engine}' cannot train {stage}" in text


def test_a_launched_engine_without_launch_says_what_to_give():
    assert "stages.sft.launch: engine 'megatron' is launched: give `launch`" in problems("stages.sft.engine=megatron")


def test_bad_launch_fields_are_named():
    assert "stages.pretrain.launch.env" in problems("stages.pretrain.launch={env: {image: a, venv: b}}")
    text = problems("stages.pretrain.launch={env: {venv: v}, gpus_per_node: 6, parallel: {tp: 4}}")
    assert "stages.pretrain.launch" in text and "not a multiple of tp * pp * cp = 4" in text
    assert "sequence_parallel needs tp > 1" in problems(
        "stages.pretrain.launch={env: {venv: v}, parallel: {sequence_parallel: true}}")
    assert "stages.pretrain.engine" in problems("stages.pretrain.engine=jax")


@pytest.mark.parametrize("stage,engine,launch,named", [
    ("sft", "megatron", VENV, "stages.sft.stages[1].normalization"),
    ("rl", "nemo_rl", NEMO_RL, "stages.rl.rewards.format"),
])
def test_run_refuses_an_untranslatable_block_before_any_work(tmp_path, stage, engine, launch, named):
    from typer.testing import CliRunner

    from stagewise.cli import app

    result = CliRunner().invoke(app, ["run", str(TINY), "--stages", stage, "--set", f"workdir={tmp_path / 'work'}",
                                      *[a for s in (f"stages.{stage}.engine={engine}", f"stages.{stage}.launch={launch}")
                                        for a in ("--set", s)]])
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split())
    assert not (tmp_path / "work").exists()  # nothing started


def test_run_exits_2_naming_the_missing_engine_and_how_to_get_it(tmp_path):
    from typer.testing import CliRunner

    from stagewise.cli import app

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"base: {TINY}\nworkdir: {tmp_path / 'work'}\nstages:\n  pretrain:\n    engine: megatron\n"
                      f"    launch:\n      env: {{venv: {tmp_path / 'no-venv'}, workdir: /opt/Megatron-Bridge}}\n"
                      "      gpus_per_node: 2\n")
    result = CliRunner().invoke(app, ["run", str(recipe), "--stages", "pretrain"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "stages.pretrain.launch.env.venv" in text and "r.yaml:7" in text
    assert "megatron-bridge" in text and "nvcr.io/nvidia/nemo" in text  # how to get it
    assert not (tmp_path / "work" / "stages").exists()  # nothing started


CPU_JOB = "{scheduler: slurm, env: {venv: /shared/venv}, gpus_per_node: 0}"


@pytest.mark.parametrize("stage", ["pretrain", "merge", "long_context", "sft", "rl", "distill", "quantize"])
def test_every_stage_takes_a_launch_and_runs_on_our_engine_as_a_job(stage):
    """engine torch with a launch: the stage runs as one job (flows/stage_job.py); gpus_per_node 0 is a CPU job."""
    from stagewise.flows.stage_job import stage_launch

    r = load_recipe(TINY, [f"stages.{stage}.launch={CPU_JOB}"]).recipe
    launch = stage_launch(r, stage)
    assert launch is not None and launch.scheduler == "slurm" and launch.gpus_per_node == 0
    assert stage_launch(load_recipe(TINY).recipe, stage) is None  # no launch: in the run's process


def test_a_launched_engine_on_no_gpus_is_refused_naming_the_field():
    text = problems("stages.pretrain.engine=megatron", "stages.pretrain.launch={env: {venv: v}, gpus_per_node: 0}")
    assert "stages.pretrain.launch.gpus_per_node: engine 'megatron' runs on GPUs" in text


def test_where_our_engine_runs_is_no_part_of_its_steps():
    """The same step directory in process and as a job (so a rerun either way reuses it); a launched
    engine's launch stays part of its step."""
    from stagewise.engines.config import where_free
    from stagewise.recipe.blocks.on_policy import block_spec

    here, there = (load_recipe(TINY, sets).recipe.stages for sets in ([], [f"stages.rl.launch={CPU_JOB}",
                                                                           f"stages.sft.launch={CPU_JOB}"]))
    assert block_spec(there.rl, set()) == block_spec(here.rl, set())
    assert where_free(there.sft) == here.sft
    mega = load_recipe(TINY, ["stages.pretrain.engine=megatron", f"stages.pretrain.launch={VENV}"]).recipe.stages
    assert where_free(mega.pretrain).launch is not None


def test_a_gate_a_person_reviews_needs_our_engine():
    """A review pauses the stage between stretches and may extend it: a launched engine has neither."""
    text = problems(*MEGATRON_SFT, "stages.sft.stages[0].gate.review=undecided")
    assert ("stages.sft.stages[0].gate.review: review: undecided needs our engine (engine: torch); a stage on "
            "megatron trains its budget in one launch") in text
    r = load_recipe(TINY, ["stages.sft.stages[0].gate.review=always", "stages.sft.stages[0].gate.review_timeout_s=60"])
    assert r.recipe.stages.sft.stages[0].gate.review == "always"
