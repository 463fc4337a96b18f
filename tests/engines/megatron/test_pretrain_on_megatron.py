"""`engine: megatron` for pretraining, end to end on CPU against a stand-in Megatron-Bridge
(tests/engines/fake_engines/megatron.py: the real one needs CUDA): one launch per phase under
torchrun with that phase's blend of our shards as indexed datasets, the HF-bridge export adopted
as the stage's checkpoint, the engine's lines in the Prefect task log and its log in MLflow, the
engine logging into the stage's own MLflow run, and a failing launch failing the run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.engines.fake_engines.megatron import run_stagewise

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "recipes" / "tiny.yaml"
SETS = [  # 8 steps of 4 x 64 tokens on 2 "GPUs"; the quality blend from step 6
    "stages.pretrain.tokens=2048", "stages.pretrain.seq_length=64", "stages.pretrain.global_batch=4",
    "stages.pretrain.micro_batch=2", "stages.pretrain.schedule.warmup_tokens=256",
    "stages.pretrain.checkpoint_every_tokens=1024", "stages.pretrain.val_tokens=2048",
    "stages.pretrain.phases[0].until=0.75",
    "data.world={facts: 30, arithmetic: 30, stdlib_files: 2, retrieval: 5, noisy: 10}", "tokenizer.vocab_size=300",
]


def run(workdir: Path, fake, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_stagewise(TINY, "pretrain", ["pretrain"], fake, [f"workdir={workdir}", *SETS, *extra], env)


@pytest.mark.slow
def test_pretraining_on_megatron_launches_each_phase_and_hands_on_the_export(fake_megatron, tmp_path):
    proc = run(tmp_path / "work", fake_megatron)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    result = summary["stages"][0]
    ckpt = Path(result["checkpoint"])
    meta = json.loads((ckpt / "stagewise.json").read_text())
    assert meta["stage"] == "pretrain" and meta["step"] == 8 and meta["tokens_seen"] == 2048
    assert meta["extra"] == {"engine": "megatron"} and (ckpt / "tokenizer.json").is_file()
    assert result["metrics"]["validation_loss"] > 0  # scored by us on the adopted export

    launches = [json.loads(line) for line in (ckpt.parent / "megatron" / "launches.jsonl").read_text().splitlines()]
    assert [x["world_size"] for x in launches] == [2, 2]  # torchrun, one process per GPU
    opts = [dict(a.split("=", 1) for a in x["argv"] if "=" in a) for x in launches]
    assert [o["train.train_iters"] for o in opts] == ["6", "8"]  # the phases' ends, one schedule
    assert all(o["checkpoint.load"] == o["checkpoint.save"] == f'"{ckpt.parent / "megatron"}"' for o in opts)  # phase 2 resumes phase 1
    assert "noisy" in opts[0]["dataset.blend"] and "noisy" not in opts[1]["dataset.blend"]
    assert "stdlib" in opts[1]["dataset.blend"]

    from mlflow import MlflowClient

    client = MlflowClient(summary["tracking_uri"])
    run_id = result["run_id"]
    assert [m.value for m in client.get_metric_history(run_id, "megatron/lm_loss")] == [9.5, 9.5]
    logs = {a.path for a in client.list_artifacts(run_id, "launch")}
    assert logs == {f"launch/{n}.log" for n in ("megatron-train-diversity", "megatron-train-quality", "megatron-export")}
    assert "eval/validation/loss" in client.get_run(run_id).data.metrics
    logged = [line for line in (proc.stderr + proc.stdout).splitlines() if "Task run 'launch-engine" in line]
    assert any(line.endswith("megatron-train-quality |  [iteration     8/    8] lm loss: 9.5") for line in logged), logged


@pytest.mark.slow
def test_a_failing_launch_fails_the_run_with_its_status_and_hands_on_nothing(fake_megatron, tmp_path):
    proc = run(tmp_path / "work", fake_megatron, env={"FAKE_MEGATRON_FAIL": "1"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    # torchrun exits 1 when a rank fails (the rank's own status 3 is in its report)
    assert "megatron-train-diversity exited with status 1" in text and "CUDA error: out of memory" in text
    assert not list((tmp_path / "work" / "stages").glob("pretrain-*/step-*"))
