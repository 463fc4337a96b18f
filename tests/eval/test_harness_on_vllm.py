"""lm-eval suites through a real vLLM server (lm-eval's local-completions model) score a checkpoint as
the in-process HFLM does: the same items, the same metrics (fp32 on both sides; generation greedy,
multiple choice by log-likelihood from the server's echoed prompt log-probs)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from stagewise.cli import app

runner = CliRunner()


@pytest.mark.vllm
def test_the_world_suite_scores_the_same_through_vllm(vllm_server, dense_chat_checkpoint):
    from stagewise.eval.harness import run_checkpoint, run_tasks_on_server
    from stagewise.model.build import load_model
    from stagewise.model.rollout.vllm import VLLMGenerator
    from stagewise.model.vllm_client import VLLMClient

    gen = VLLMGenerator(load_model(dense_chat_checkpoint), [2], 0, url=vllm_server.url, keep_copy=False)
    gen.sync_weights(load_model(dense_chat_checkpoint).state_dict())  # the checkpoint's weights, whatever came before
    gen.close()
    served = run_tasks_on_server(vllm_server.url, VLLMClient(vllm_server.url).model(), dense_chat_checkpoint,
                                 ["world"], limit=8, max_length=1024)
    local = run_checkpoint(dense_chat_checkpoint, ["world"], limit=8)
    assert set(served.metrics) == set(local.metrics) and len(local.metrics) >= 6, sorted(served.metrics)
    assert served.metrics == pytest.approx(local.metrics, abs=1e-9), (served.metrics, local.metrics)


def test_eval_engine_refusals_name_the_option(dense_chat_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("STAGEWISE_VLLM_PYTHON", str(tmp_path / "no-python"))
    for args, message in [(["--tasks", "world", "--engine", "trt"], "--engine must be hf or vllm, got 'trt'"),
                          (["--rows", str(tmp_path), "--engine", "vllm"], "--rows scores with transformers"),
                          (["--tasks", "world", "--engine", "vllm"], "--engine vllm: STAGEWISE_VLLM_PYTHON=")]:
        result = runner.invoke(app, ["eval", str(dense_chat_checkpoint), *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
