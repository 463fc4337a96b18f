"""The launches an RL stage and a distillation round hand NeMo RL (engines/nemo_rl/stage.py): the
files written into the step directory (rows in step order with their agents, the config with our
keys) and the driver's and converter's argv, for a tiny example."""

from __future__ import annotations

import json

import pytest
import yaml

from stagewise.data.rl_curriculum import CurriculumConfig
from stagewise.data.rl_rows import RLRow
from stagewise.data.rl_sampler import CurriculumSampler
from stagewise.engines.config import EngineEnv, LaunchConfig, NemoGym
from stagewise.engines.nemo_rl.stage import distill_plan, gym_environments, rl_plan, row_agents
from stagewise.engines.nemo_rl.translate import MlflowTarget
from stagewise.eval.rl_wiring import ResolvedRow
from stagewise.model.rl_batches import RolloutSettings, SamplingSettings
from stagewise.recipe.blocks.distill import DistillStage, TeacherSpec
from stagewise.recipe.blocks.rl import RLData, RLSource, RLStage

LAUNCH = LaunchConfig(env=EngineEnv(venv="/opt/nemo-rl/.venv", workdir="/opt/nemo-rl"), gpus_per_node=2)
GYM = NemoGym(agents={"exact_answer": "math_agent", "json_answer": "json_agent"},
              config_paths=["resources_servers/math_with_judge/configs/math_with_judge.yaml"])
MLFLOW = MlflowTarget("tiny", "rl", "sqlite:////w/mlflow.db", "run1")


def _task_rows() -> list[ResolvedRow]:
    out = []
    for domain, env in (("arithmetic", "exact_answer"), ("format", "json_answer")):
        for k in range(6):
            row = RLRow.model_validate({"id": f"{domain}-{k}", "domain": domain, "environment": env,
                                        "responses_create_params": {"input": f"q {k}"}, "expected_answer": k})
            out.append(ResolvedRow(id=f"{domain}:{k}", domain=domain, environment=env, row=row))
    own = RLRow.model_validate({**out[0].row.as_json(), "agent_ref": {"type": "responses_api_agents", "name": "own"}})
    out[0] = ResolvedRow(id=out[0].id, domain="arithmetic", environment="exact_answer", row=own)
    return out


def _by_domain(rows: list[ResolvedRow]) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {}
    for i, r in enumerate(rows):
        out.setdefault(r.domain, []).append((r.id, (i % 5) / 4))
    return out


def test_agents_come_from_the_row_else_its_verifier():
    rows = _task_rows()
    agents = row_agents(rows, GYM)
    assert agents["arithmetic:0"] == "own" and agents["arithmetic:1"] == "math_agent"
    assert agents["format:3"] == "json_agent"
    assert gym_environments(rows) == {"exact_answer", "json_answer"}
    assert gym_environments(rows[:1]) == set()  # a row naming its own agent needs no verifier's
    assert row_agents(rows, None) == {"arithmetic:0": "own"}


def test_rl_writes_the_rows_in_step_order_and_the_config_then_train_and_export(tmp_path):
    rows = _task_rows()
    stage = RLStage(data=RLData(sources=[RLSource(name="a", path="a.jsonl")]), steps=4, prompts_per_step=2,
                    reasoning=True, engine="nemo_rl", launch=LAUNCH, nemo_gym=GYM,
                    rollout=RolloutSettings(group_size=4, max_new_tokens=8, off_policy=False, minibatches=2,
                                            max_refills=1))
    by_domain, ratios = _by_domain(rows), {"arithmetic": 1.0, "format": 1.0}
    out = tmp_path / "rl-abc"
    plan = rl_plan(stage, start="/w/sft/step-2", rows={r.id: r.row for r in rows}, agents=row_agents(rows, GYM),
                   by_domain=by_domain, ratios=ratios, max_prompt_tokens=24, out_dir=out, seed=5, mlflow=MLFLOW)
    train, export = plan.steps
    config = out / "nemo-rl" / "grpo.yaml"
    assert (train.name, train.style, train.one_node) == ("nemo-rl-train", "single", False)
    assert train.entry == ["python", "examples/nemo_gym/run_grpo_nemo_gym.py", "--config", str(config)]
    step = out / "nemo-rl" / "checkpoints" / "step_2"  # 4 optimizer steps = 2 rollout steps
    assert (export.name, export.one_node) == ("nemo-rl-export", True)
    assert export.entry == ["python", "examples/converters/convert_megatron_to_hf.py", "--config",
                            f"{step}/config.yaml", "--megatron-ckpt-path", f"{step}/policy/weights/iter_0000000",
                            "--hf-ckpt-path", str(out / "nemo-rl-export")]
    assert (plan.export_dir, plan.step, plan.tokens) == (out / "nemo-rl-export", 4, 0)

    written = [json.loads(line) for line in (out / "nemo-rl" / "train.jsonl").read_text().splitlines()]
    sampler = CurriculumSampler(by_domain, ratios, 2, 2, CurriculumConfig(), 5)  # what our engine would draw
    order = [*sampler.sample(1, 0), *sampler.sample(2, 0), *sampler.sample(2, 1), *sampler.sample(2, 2)]
    by_id = {r.id: r for r in rows}
    assert [w["id"] for w in written] == [by_id[i].row.as_json()["id"] for i in order]  # + 2 refill batches
    assert all(w["agent_ref"]["name"] == row_agents(rows, GYM)[i] for w, i in zip(written, order))

    cfg = yaml.safe_load(config.read_text())
    assert cfg["defaults"] == "/opt/nemo-rl/examples/nemo_gym/grpo_nanov3.yaml"
    assert cfg["data"]["train"]["data_path"] == str(out / "nemo-rl" / "train.jsonl") and cfg["data"]["shuffle"] is False
    assert cfg["policy"]["model_name"] == "/w/sft/step-2" and cfg["policy"]["max_total_sequence_length"] == 32
    assert (cfg["grpo"]["max_num_steps"], cfg["policy"]["train_global_batch_size"]) == (2, 4)
    assert cfg["grpo"]["seed"] == 5 and cfg["checkpointing"]["checkpoint_dir"] == str(out / "nemo-rl" / "checkpoints")
    assert cfg["env"]["nemo_gym"]["config_paths"][1:] == GYM.config_paths
    assert cfg["logger"]["mlflow"] == {"experiment_name": "tiny", "run_name": "rl", "tracking_uri": "sqlite:////w/mlflow.db",
                                       "run_id": "run1"}


def test_a_distill_round_routes_its_teachers_by_agent(tmp_path):
    rows = _task_rows()[1:]  # every row under its verifier's agent
    launch = LaunchConfig(env=EngineEnv(image="nvcr.io/nvidia/nemo-rl:v0.6.0"), scheduler="slurm", nodes=3,
                          gpus_per_node=8)
    stage = DistillStage(teachers=[TeacherSpec(name="math", domains=["arithmetic"], checkpoint="/t/m"),
                                   TeacherSpec(name="fmt", domains=["format"], checkpoint="/t/f")],
                         steps=3, prompts_per_step=2, reasoning=True, engine="nemo_rl", launch=launch, nemo_gym=GYM,
                         rollout=SamplingSettings(group_size=2, max_new_tokens=8, off_policy=True))
    by_domain = {d: [(i, 0.5) for i, _ in v] for d, v in _by_domain(rows).items()}
    out = tmp_path / "distill-round-abc"
    plan = distill_plan(stage, student="/w/sft", teachers={"math": "/t/m", "fmt": "/t/f"}, rows={r.id: r.row for r in rows},
                        agents=row_agents(rows, GYM), by_domain=by_domain, ratios={"arithmetic": 1.0, "format": 1.0},
                        max_prompt_tokens=24, out_dir=out, seed=1, mlflow=MLFLOW)
    train, export = plan.steps
    assert train.entry[-1] == str(out / "nemo-rl" / "mopd.yaml")
    assert export.entry[:5] == ["uv", "run", "--extra", "mcore", "python"]  # the image's venv lacks Megatron-Core
    cfg = yaml.safe_load((out / "nemo-rl" / "mopd.yaml").read_text())
    opd = cfg["on_policy_distillation"]
    assert opd["teacher_model_by_agent_name"] == {"math_agent": "/t/m", "json_agent": "/t/f"}
    assert cfg["grpo"]["adv_estimator"] == {"name": "opd"} and cfg["grpo"]["max_num_steps"] == 3
    assert len((out / "nemo-rl" / "train.jsonl").read_text().splitlines()) == 3 * 2  # no refills: no dynamic sampling

    from stagewise.data.errors import BadInput

    mixed = {**row_agents(rows, GYM), rows[-1].id: "math_agent"}  # a format row under the math agent
    with pytest.raises(BadInput, match="domain 'format' has rows under agents json_agent, math_agent"):
        distill_plan(stage, student="/w/sft", teachers={"math": "/t/m", "fmt": "/t/f"}, rows={r.id: r.row for r in rows},
                     agents=mixed, by_domain=by_domain, ratios={"arithmetic": 1.0, "format": 1.0},
                     max_prompt_tokens=24, out_dir=tmp_path / "x", seed=1, mlflow=MLFLOW)


def test_a_distill_round_on_nemo_rl_hands_run_engine_its_plan(tmp_path, tiny_checkpoint, monkeypatch):
    """flows/distill.py's round on NeMo RL: the student's tokenizer sizes the sequence, the round's
    teachers and rows go into the plan, and run_engine gets the stage's launch and the round's run."""
    from types import SimpleNamespace

    import stagewise.flows.distill
    from stagewise.flows.distill import DistillInputs, _round_on_nemo_rl
    from stagewise.flows.rl import StageRows

    rows = _task_rows()[1:]
    launch = LaunchConfig(env=EngineEnv(venv="/opt/nemo-rl/.venv", workdir="/opt/nemo-rl"), scheduler="slurm",
                          nodes=3, gpus_per_node=8)
    stage = DistillStage(teachers=[TeacherSpec(name="math", domains=["arithmetic"], checkpoint="/t/m"),
                                   TeacherSpec(name="fmt", domains=["format"], checkpoint="/t/f")],
                         steps=2, prompts_per_step=2, reasoning=True, engine="nemo_rl", launch=launch, nemo_gym=GYM)
    block = DistillInputs(stage=stage, data=RLData(sources=[RLSource(name="a", path="a.jsonl")]))
    seen = {}
    monkeypatch.setattr(stagewise.flows.distill, "run_engine", lambda *a, **kw: seen.update(args=a, kw=kw) or "adopted")
    ctx = SimpleNamespace(seed=3, tracker=SimpleNamespace(experiment="tiny", uri="sqlite:////w/m.db"))
    got = _round_on_nemo_rl(ctx, block, str(tiny_checkpoint), {"math": "/t/m", "fmt": "/t/f"},
                            StageRows(rows, [], [], None), tmp_path / "round", "round-run")
    _, stage_name, engine, given_launch, run_id, out_dir, plan = seen["args"]
    assert (got, stage_name, engine, given_launch, run_id) == ("adopted", "distill", "nemo_rl", launch, "round-run")
    assert seen["kw"] == {"parent": str(tiny_checkpoint), "tokenizer_dir": str(tiny_checkpoint)}
    assert [s.name for s in plan.steps] == ["nemo-rl-train", "nemo-rl-export"] and plan.step == 2
    cfg = yaml.safe_load((out_dir / "nemo-rl" / "mopd.yaml").read_text())
    assert cfg["policy"]["model_name"] == str(tiny_checkpoint) and cfg["logger"]["mlflow"]["run_id"] == "round-run"
    assert cfg["on_policy_distillation"]["teacher_model_by_agent_name"] == {"math_agent": "/t/m", "json_agent": "/t/f"}
    assert cfg["policy"]["max_total_sequence_length"] > stage.rollout.max_new_tokens  # + the longest prompt
