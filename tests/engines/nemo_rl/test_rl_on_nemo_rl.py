"""`engine: nemo_rl` for RL, end to end on CPU against a stand-in NeMo RL
(tests/engines/fake_engines/nemo_rl.py: the real one needs CUDA, Ray and NeMo Gym): our difficulty
filter and curriculum written as ordered NeMo Gym rows, one driver launch with the GRPO config
(two optimizer updates per rollout step: rollout.minibatches 2), NeMo RL's Megatron converter,
the export adopted as the stage's checkpoint and scored by the stage's held-out evaluation, the
driver's lines in the Prefect task log and its log in MLflow, and a failing driver failing the stage.

Distillation on NeMo RL reserves whole nodes for its teachers, so it needs two nodes at least
(Slurm or Kubernetes): its launches are checked as plans (test_nemo_rl_stage_plans.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.engines.fake_engines.nemo_rl import run_stagewise

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "recipes" / "tiny.yaml"
GYM = ("{agents: {exact_answer: math_with_judge_simple_agent, json_answer: structured_outputs_simple_agent}, "
       "config_paths: [resources_servers/math_with_judge/configs/math_with_judge.yaml, "
       "resources_servers/structured_outputs/configs/structured_outputs_json.yaml]}")
SETS = [  # 4 optimizer steps = 2 rollout steps of 4 prompts x 4 responses, 2 updates each
    "stages.rl.data.world={per_domain: 24, eval_fraction: 0.25, max_digits: 1, format_kinds: [json_answer]}",
    "stages.rl.data.heldout_limit=4", "stages.rl.data.heldout_samples=2",
    "stages.rl.steps=4", "stages.rl.prompts_per_step=4", "stages.rl.filter={samples: 2, drop_solved: true}",
    "stages.rl.rollout={group_size: 4, max_new_tokens: 4, off_policy: false, minibatches: 2, max_refills: 1}",
    "stages.rl.curriculum={}", "stages.rl.rewards={accuracy: 1.0}", "stages.rl.reasoning=true",
    "stages.rl.checkpoint_every_steps=null", f"stages.rl.nemo_gym={GYM}",
]


def run(workdir: Path, fake, start: Path, *extra: str, env: dict | None = None):
    return run_stagewise(TINY, "rl", ["rl"], fake, [f"workdir={workdir}", f"model.from={start}", *SETS, *extra], env)


@pytest.fixture(scope="module")
def finished(fake_nemo_rl, tiny_checkpoint, tmp_path_factory):
    """One RL run on the stand-in engine: (workdir, the CLI's process)."""
    workdir = tmp_path_factory.mktemp("rl-nemo-rl") / "work"
    return workdir, run(workdir, fake_nemo_rl, tiny_checkpoint)


@pytest.mark.slow
def test_rl_trains_on_nemo_rl_and_the_adopted_export_is_scored_and_handed_on(finished, tiny_checkpoint):
    workdir, proc = finished
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    result = summary["stages"][0]
    ckpt = Path(result["checkpoint"])
    assert ckpt.name == "step-00000004"  # our optimizer steps, not NeMo RL's 2 rollout steps
    meta = json.loads((ckpt / "stagewise.json").read_text())
    assert meta["stage"] == "rl" and meta["step"] == 4 and meta["extra"] == {"engine": "nemo_rl"}
    assert meta["parent"] == str(tiny_checkpoint) and (ckpt / "tokenizer.json").is_file()
    from safetensors.torch import load_file

    start, export = (load_file(next(p.glob("*.safetensors"))) for p in (tiny_checkpoint, ckpt))
    assert start.keys() == export.keys() and any((start[k] != export[k]).any() for k in start)  # the export's weights
    for key in ("rl/test/pass_at_1/all", "base/rl/test/pass_at_1/all", "rl/test/pass_at_1/all_delta", "rl/dev/pass_at_1/all"):
        assert key in result["metrics"], result["metrics"]  # scored by us, before and on the adopted export

    stage = ckpt.parent
    (launch,) = [json.loads(x) for x in (stage / "nemo-rl" / "checkpoints" / "launches.jsonl").read_text().splitlines()]
    cfg = launch["config"]
    assert cfg == yaml.safe_load((stage / "nemo-rl" / "grpo.yaml").read_text())
    assert cfg["grpo"]["max_num_steps"] == 2 and cfg["policy"]["train_global_batch_size"] == 8
    assert cfg["policy"]["model_name"] == str(tiny_checkpoint) and cfg["grpo"]["use_dynamic_sampling"] is True
    assert cfg["logger"]["mlflow"]["run_id"] == result["run_id"]
    rows = [json.loads(x) for x in (stage / "nemo-rl" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == launch["rows"] == (2 + 2) * 4  # two steps' prompts, then one refill batch per step
    agents = {r["domain"]: r["agent_ref"]["name"] for r in rows}
    assert agents == {"arithmetic": "math_with_judge_simple_agent", "format": "structured_outputs_simple_agent"}
    assert (stage / "nemo-rl-export" / "config.json").is_file()

    from mlflow import MlflowClient

    client = MlflowClient(summary["tracking_uri"])
    run_id = result["run_id"]
    assert [m.value for m in client.get_metric_history(run_id, "nemo_rl/train/reward")] == [0.25, 0.5]
    assert {a.path for a in client.list_artifacts(run_id, "launch")} == {"launch/nemo-rl-train.log",
                                                                         "launch/nemo-rl-export.log"}
    logged = [line for line in (proc.stderr + proc.stdout).splitlines() if "Task run 'launch-engine" in line]
    assert any(line.endswith("nemo-rl-train | Step 2/2: 2 optimizer updates of 8 samples") for line in logged), logged
    assert any("nemo-rl-export | Saved HF checkpoint to:" in line for line in logged), logged


@pytest.mark.slow
def test_a_failing_driver_fails_the_stage_and_hands_on_nothing(finished, fake_nemo_rl, tiny_checkpoint):
    workdir, _ = finished
    before = sorted(workdir.glob("stages/rl-*/step-*"))
    proc = run(workdir, fake_nemo_rl, tiny_checkpoint, "stages.rl.optimizer.lr=1.0e-3",
               env={"FAKE_NEMO_RL_FAIL": "1"})  # another lr: a new step, the rows reused
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "nemo-rl-train exited with status 3" in text and "CUDA error: out of memory" in text
    assert sorted(workdir.glob("stages/rl-*/step-*")) == before
