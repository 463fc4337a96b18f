"""`stagewise serve-model`: a checkpoint behind vLLM's OpenAI-compatible server, through its own template.

The refusals run anywhere (nothing starts); the chat completion runs the real vLLM (marked `vllm`):
the request's prompt is the template's own reasoning-off rendering, token for token, and Ctrl-C
(SIGINT) stops the server and the command cleanly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stagewise.cli import app
from stagewise.model.vllm_client import VLLMClient
from stagewise.model.vllm_server import free_port

runner = CliRunner()


def _quantized_copy(src: Path, dest: Path) -> Path:
    """`src` as a modelopt export declares itself (config.json's quantization_config), weights aside."""
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_what_cannot_be_served_is_refused_before_anything_starts(dense_chat_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("STAGEWISE_VLLM_PYTHON", str(tmp_path / "no-python"))
    cases = [
        ([str(tmp_path / "nowhere")], "does not exist"),
        ([str(dense_chat_checkpoint), "--reasoning", "maybe"], "--reasoning must be on, off or template"),
        ([str(_quantized_copy(dense_chat_checkpoint, tmp_path / "nvfp4"))],
         "is a MIXED_PRECISION export: vLLM serves it only on a CUDA GPU"),
        ([str(dense_chat_checkpoint)], "no-python: no such file; build vLLM's CPU build"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["serve-model", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)


@pytest.mark.vllm
def test_a_chat_completion_through_the_checkpoints_template_then_ctrl_c_stops_it(vllm_python, dense_chat_checkpoint,
                                                                                 tmp_path):
    from transformers import AutoTokenizer

    port = free_port()
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "stagewise.cli", "serve-model", str(dense_chat_checkpoint),
                                 "--port", str(port), "--reasoning", "off", "--log", str(tmp_path / "vllm.log")],
                                stdout=o, stderr=e, env=dict(os.environ, STAGEWISE_VLLM_PYTHON=str(vllm_python)))
    try:
        deadline = time.monotonic() + 600
        while "serving" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert f"serving {dense_chat_checkpoint.name} at http://127.0.0.1:{port}/v1" in out.read_text(), \
            err.read_text()[-3000:]
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        body = json.dumps({"model": dense_chat_checkpoint.name, "messages": messages, "max_tokens": 6,
                           "temperature": 0, "return_token_ids": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            reply = json.loads(answer.read())
        tok = AutoTokenizer.from_pretrained(dense_chat_checkpoint)
        want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False,
                                       reasoning=False)  # our template's switch, set off by --reasoning off
        assert want != tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert reply["prompt_token_ids"] == want
        assert reply["choices"][0]["message"]["role"] == "assistant" and reply["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
    assert code == 0, err.read_text()[-3000:]
    assert "stopped" in err.read_text()
    assert not VLLMClient(f"http://127.0.0.1:{port}").healthy()
