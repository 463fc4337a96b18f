"""End to end: `stagewise run recipes/tiny.yaml --stages pretrain` on CPU.

Checks what a user relies on: the command finishes, the validation loss falls well below
the unigram baseline, the final checkpoint loads with transformers, and MLflow holds the
parent and nested stage runs with the engine's metrics.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 400_000  # enough to beat the unigram baseline clearly, short enough for CI


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny")
    cmd = [
        sys.executable, "-m", "flows.cli", "run", str(ROOT / "recipes" / "tiny.yaml"), "--stages", "pretrain",
        "--set", f"workdir={workdir}", "--set", f"stages.pretrain.tokens={TOKENS}",
        "--set", "stages.pretrain.checkpoint_every_tokens=100000", "--json",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, CI="1"), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    return workdir, summary


@pytest.mark.slow
def test_validation_loss_beats_unigram_baseline(pipeline_run):
    _, summary = pipeline_run
    metrics = summary["stages"][0]["metrics"]
    assert metrics["validation_loss"] < metrics["validation_unigram_baseline"] - 1.0, metrics


@pytest.mark.slow
def test_final_checkpoint_loads_with_transformers(pipeline_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, summary = pipeline_run
    ckpt = Path(summary["stages"][0]["checkpoint"])
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok("The capital of", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape[-1] >= len(tok) and torch.isfinite(logits).all()
    meta = json.loads((ckpt / "stagewise.json").read_text())
    assert meta["stage"] == "pretrain" and meta["tokens_seen"] > 0


@pytest.mark.slow
def test_mlflow_holds_parent_and_stage_runs(pipeline_run):
    from mlflow import MlflowClient

    _, summary = pipeline_run
    client = MlflowClient(tracking_uri=summary["tracking_uri"])
    exp = client.get_experiment_by_name(summary["experiment"])
    runs = client.search_runs([exp.experiment_id])
    stage_runs = [r for r in runs if r.data.tags.get("stagewise.stage") == "pretrain"]
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(stage_runs) == 1 and len(parents) == 1
    assert stage_runs[0].data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert parents[0].data.tags.get("prefect.flow_run_id")
    metrics = stage_runs[0].data.metrics
    for name in ("train/lm_loss", "train/lb_loss", "train/grad_norm", "train/params_norm", "train/num_zeros",
                 "train/lr", "train/tokens_per_s", "tokens_seen", "eval/validation/loss"):
        assert name in metrics, (name, sorted(metrics))
    assert any(k.startswith("moe/") and k.endswith("/max_vio") for k in metrics)
    assert any(k.startswith("act/") and k.endswith("/rms") for k in metrics)
    history = client.get_metric_history(stage_runs[0].info.run_id, "train/lm_loss")
    assert len(history) >= 10 and history[-1].value < history[0].value
    artifacts = [a.path for a in client.list_artifacts(stage_runs[0].info.run_id, "reports")]
    assert "reports/pretrain_loss.png" in artifacts
