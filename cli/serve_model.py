"""`stagewise serve-model`: a trained checkpoint behind vLLM's OpenAI-compatible server.

The last step a team takes with what the pipeline handed on: chat with it, point an application or
an evaluation harness at it. The checkpoint's own chat template (the one it was trained through)
renders every chat request, and `--reasoning on|off` sets its reasoning switch for every request
(a client may still send `chat_template_kwargs`). The server is model/vllm_server.py's, without
the weight-reload endpoints (nothing trains it); the command returns when it stops: Ctrl-C or
SIGTERM stop it cleanly, a server that dies is an error with the end of its log.

What cannot be served is refused before anything starts (exit 2): not a checkpoint, a template with
no reasoning switch asked to switch, a quantized export (NVFP4/FP8, stagewise quantize) without a
CUDA GPU (vLLM's CPU build has no kernels for them), no vLLM to run (model/vllm_server.py says how
to get one).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Optional

import typer

from stagewise.cli.options import DebugOpt
from stagewise.cli.output import guarded
from stagewise.recipe.errors import BadInput


def _quantized_format(ckpt: Path) -> str | None:
    """The quantization a checkpoint's config declares (modelopt's export), or None for plain weights."""
    quant = json.loads((ckpt / "config.json").read_text()).get("quantization_config") or {}
    if not quant and (ckpt / "hf_quant_config.json").is_file():
        quant = json.loads((ckpt / "hf_quant_config.json").read_text()).get("quantization") or {"quant_algo": "?"}
    if not quant:
        return None
    return str(quant.get("quant_algo") or quant.get("quant_method") or "quantized")


def _reasoning_kwargs(ckpt: Path, reasoning: str) -> dict | None:
    """The template kwargs that set `reasoning` (on/off) through the template's own switch; None for `template`."""
    if reasoning == "template":
        return None
    from transformers import AutoTokenizer

    from stagewise.data.reasoning_switch import KwargSwitch, resolve_switch

    switch = resolve_switch(AutoTokenizer.from_pretrained(ckpt))
    if not isinstance(switch, KwargSwitch):
        raise BadInput(f"--reasoning {reasoning}: {ckpt}'s chat template has no reasoning variable to set "
                       "(neither `reasoning` nor `enable_thinking`); serve it with --reasoning template")
    return {switch.name: switch.when_on if reasoning == "on" else switch.when_off}


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@guarded
def serve_model_cmd(
    checkpoint: Path = typer.Argument(..., help="A checkpoint directory (a stage's step-N, a merge, an export).", show_default=False),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    reasoning: str = typer.Option("template", "--reasoning", help="on or off: set the template's reasoning switch for every request; template: leave its default."),
    dtype: str = typer.Option("auto", "--dtype", help="Weights' dtype in vLLM (auto: the checkpoint's; float32, bfloat16, float16)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", min=16, help="Longest prompt + answer in tokens (default: the model's)."),
    log: Optional[Path] = typer.Option(None, "--log", help="vLLM's log file (default: a temporary file, named on start)."),
    debug: bool = DebugOpt,
) -> None:
    """Serve a checkpoint with vLLM's OpenAI-compatible server, through its own chat template.

    vLLM runs from STAGEWISE_VLLM_PYTHON (on CPU: `python3 dev.py vllm-env` builds .venv-vllm) or from
    this Python when it has vllm. Ctrl-C stops it.

    \b
    Example:
      STAGEWISE_VLLM_PYTHON=.venv-vllm/bin/python stagewise serve-model runs/tiny/stages/rl-*/step-8 --reasoning off
      curl -s 127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"model": "step-8", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}'
    """
    from stagewise.model.checkpoint_check import check_checkpoint
    from stagewise.model.vllm_server import VLLMServer, vllm_python

    if reasoning not in ("on", "off", "template"):
        raise BadInput(f"--reasoning must be on, off or template, got {reasoning!r}")
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise BadInput(f"--dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    check_checkpoint(checkpoint, weights=False, tokenizer=True, nemotron=False)
    quantized = _quantized_format(checkpoint)
    if quantized:
        import torch

        if not torch.cuda.is_available():
            raise BadInput(f"{checkpoint} is a {quantized} export: vLLM serves it only on a CUDA GPU (its CPU build "
                           "has no NVFP4 or FP8 kernels; docs/STACK.md); serve it on a GPU machine, or serve the "
                           "checkpoint it was quantized from here")
    kwargs = _reasoning_kwargs(checkpoint, reasoning)
    try:
        python = vllm_python()
    except RuntimeError as err:
        raise BadInput(str(err)) from None
    name = checkpoint.resolve().name
    extra = ["--default-chat-template-kwargs", json.dumps(kwargs)] if kwargs else []
    server = VLLMServer(checkpoint, python=python, host=host, port=port, dtype=dtype, max_model_len=max_model_len,
                        weight_reload=False, served_name=name, log_path=log, extra_args=extra)
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C, a service manager's stop, even if started with SIGINT ignored
        signal.signal(sig, _interrupt)
    typer.echo(f"starting vLLM on {checkpoint} (log: {server.log_path}) ...", err=True)
    t0 = time.monotonic()
    try:
        server.start()
        typer.echo(f"serving {name} at {server.url}/v1 (OpenAI-compatible: /v1/chat/completions, /v1/completions), "
                   f"ready in {time.monotonic() - t0:.0f} s; Ctrl-C stops it")
        while server.process is not None and server.process.poll() is None:
            time.sleep(0.5)
        status = server.stop()
        raise RuntimeError(f"the vLLM server stopped by itself (exit {status}); the end of {server.log_path}:\n"
                           f"{server.log_tail()}")
    except KeyboardInterrupt:
        typer.echo("stopping vLLM ...", err=True)
        server.stop()
        typer.echo("stopped", err=True)
    finally:
        server.stop()
