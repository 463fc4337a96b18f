"""An on-policy stage with `backend: vllm` and no `vllm_url` starts a vLLM server of its own (the real
one, from .venv-vllm) on its starting checkpoint, samples through it, and stops it with the stage:
what flows/rl.py `stage_generator` hands RL and distillation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagewise.flows.rl import select, stage_generator
from stagewise.model.build import load_model
from stagewise.model.vllm_client import VLLMClient
from stagewise.recipe import load_recipe

pytestmark = pytest.mark.vllm

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def test_the_stages_own_server_starts_on_its_checkpoint_samples_and_stops_with_it(vllm_python, dense_chat_checkpoint,
                                                                                 tmp_path):
    cfg = select(load_recipe(TINY, ["stages.rl.backend=vllm"]).recipe).stage
    assert cfg.vllm_url is None and cfg.vllm_weight_sync == "files"
    policy = load_model(dense_chat_checkpoint, device="cpu")
    gen = stage_generator(cfg, policy, [2], 0, torch.device("cpu"), str(dense_chat_checkpoint), tmp_path, "fp32")
    server = gen.server
    try:
        assert VLLMClient(server.url).model() == str(dense_chat_checkpoint)  # served from the stage's start
        assert "--dtype float32" in " ".join(server.argv())  # the trainer's precision
        gen.sync_weights(policy.state_dict())
        assert (tmp_path / "vllm-weights" / "model.safetensors").is_file()  # where the reloads are read from
        (group,) = gen.generate([[5, 6, 7]], 3, 4, 1.0, 0)
        assert len(group) == 3 and all(len(r.response_ids) == len(r.logprobs) > 0 for r in group)
    finally:
        process = server.process
        gen.close()
    assert process.poll() is not None and gen.server is None
    assert not VLLMClient(server.url).healthy()
    assert "Starting vLLM server" in (tmp_path / "vllm.log").read_text()  # its log beside the stage's files
    assert not (tmp_path / "vllm-weights").exists()  # the weights copy it reloaded from: gone with it
