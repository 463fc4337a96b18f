"""An MLflow tracking server that goes away mid-stage and comes back loses no metric.

The test starts `mlflow server` on 127.0.0.1 (a free port, a SQLite store of its own), runs a
small pretraining stage against it with `stagewise run`, stops the server once the stage has
logged a few training steps, keeps it down for several seconds, restarts it on the same port
and store, and checks that the stage finishes and that every per-step training metric has
exactly one point per optimizer step. A small world and 512-token steps keep it short.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.e2e.servers import MlflowServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny.yaml"
STEP_TOKENS = 128 * 4  # seq_length x global_batch
STEPS = 80
DOWN_S = 8.0


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _loss_points(client: MlflowClient) -> int:
    """train/lm_loss points the server has for the pretrain run (0 before it exists)."""
    exp = client.get_experiment_by_name("tiny")
    if exp is None:
        return 0
    runs = client.search_runs([exp.experiment_id], "tags.`stagewise.stage` = 'pretrain'")
    return len(client.get_metric_history(runs[0].info.run_id, "train/lm_loss")) if runs else 0


def test_a_stage_survives_an_mlflow_restart_and_loses_no_metric(mlflow_server, tmp_path):
    workdir = tmp_path / "work"
    values = [
        f"workdir={workdir}", f"tracking.uri={mlflow_server.uri}",
        "data.world.stdlib_files=20", "data.world.facts=500", "data.world.arithmetic=300",
        "data.world.retrieval=20", "data.world.noisy=100", "tokenizer.vocab_size=1024",
        "stages.pretrain.seq_length=128", "stages.pretrain.global_batch=4", "stages.pretrain.micro_batch=4",
        f"stages.pretrain.tokens={STEPS * STEP_TOKENS}", "stages.pretrain.val_tokens=4096",
        "stages.pretrain.schedule.warmup_tokens=2048",
    ]
    cmd = [sys.executable, "-m", "stagewise.cli", "run", str(TINY), "--stages", "pretrain",
           *[a for v in values for a in ("--set", v)]]
    out = (tmp_path / "stagewise.log").open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, CI="1"))
    try:
        client = MlflowClient(mlflow_server.uri)
        deadline = time.monotonic() + 300
        while (seen := _loss_points(client)) < 3:
            assert proc.poll() is None, (tmp_path / "stagewise.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "no training metric reached the server"
            time.sleep(0.5)
        mlflow_server.stop()
        assert proc.poll() is None and seen < STEPS, "the stage must still be training when the server goes"
        time.sleep(DOWN_S)
        mlflow_server.start()
        assert proc.wait(timeout=600) == 0, (tmp_path / "stagewise.log").read_text()[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    exp = client.get_experiment_by_name("tiny")
    (run,) = client.search_runs([exp.experiment_id], "tags.`stagewise.stage` = 'pretrain'")
    assert run.info.status == "FINISHED"
    for key in ("train/lm_loss", "train/lr", "train/grad_norm"):  # logged once per optimizer step
        points = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert points == list(range(1, STEPS + 1)), f"{key}: {len(points)} points for {STEPS} steps"
    tokens = {m.step for m in client.get_metric_history(run.info.run_id, "tokens_seen")}
    assert set(range(1, STEPS + 1)) <= tokens
    assert not list((workdir / ".mlflow-spool").glob("*.jsonl")), "metrics left unsent"
    version = client.get_model_version_by_alias("tiny", "pretrain")  # a server takes sources in the run's artifacts
    assert Path(version.source).is_relative_to(workdir / "mlartifacts") and Path(version.source, "config.json").exists()
    log = (tmp_path / "stagewise.log").read_text()
    assert "keeping metrics" in log and "answers again" in log, "the outage never reached metric logging"
