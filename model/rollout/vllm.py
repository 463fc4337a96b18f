"""Rollouts from a running vLLM server, its weights kept equal to the trainer's every rollout step.

Two ways the trainer's weights reach the server (`weight_sync`):

- "files" (the default; CPU or GPU, one machine or a shared file system): the parameters are written
  as one safetensors file in `weights_dir` and the server reloads them in place (vLLM's worker
  method `reload_weights`, through the dev endpoint `POST /collective_rpc`; model/vllm_client.py),
  then drops its prefix cache. Sampling is vLLM's OpenAI-compatible `POST /v1/completions` with token
  prompts. The server is started by model/vllm_server.py (the stage starts one on its starting
  checkpoint when no `vllm_url` is given), with `--logprobs-mode processed_logprobs` so the
  log-probabilities it returns are those of the distribution sampled from (after temperature):
  what the GRPO objective's masked importance sampling compares with the trainer's own.
  Measured on the tiny dense preset (2M parameters, CPU): a reload takes ~0.1 s.
- "nccl" (GPU servers): TRL's VLLMClient broadcasts the parameters over NCCL into a server started
  with TRL's weight-sync flags (optional `gpu` extra):

      trl vllm-serve --model runs/tiny/stages/sft-stage2-<hash>/step-<n> --port 8000
      # or vLLM directly:
      VLLM_SERVER_DEV_MODE=1 vllm serve <checkpoint> --port 8000 --weight-transfer-config '{"backend": "nccl"}' \\
          --logprobs-mode processed_logprobs --max-logprobs -1

    gen = VLLMGenerator(policy, end_ids=[im_end], pad_id=0, url="http://127.0.0.1:8000")   # files
    gen.sync_weights(policy.state_dict())
    groups = gen.generate(prompt_ids, n=8, max_new_tokens=16, temperature=1.0, seed=7)

What the server returns and how it becomes Rollouts (`rollouts_from_server`, a pure function, in
VLLMClient.generate's shape; the OpenAI answer is put in that shape by `_from_completions`):
`completion_ids` flat and prompt-major (the n responses of prompt 0, then of prompt 1...), and per
token a list of log-probabilities sorted by probability with their token ids (`logprob_token_ids`);
the sampled token's value is the entry whose id is the token (with `logprobs=0` it is the only one).
A response is cut after its first end token and marked finished (vLLM keeps the stop token in the
token ids); without one it hit max_new_tokens. The model's own EOS stops a response only when it is
one of `end_ids` (`ignore_eos`, as the HF backends), so both backends end responses alike. A token
vLLM could not score comes back as None and is kept as NaN: the objective's masked importance
sampling drops such a token (NaN is outside [is_low, is_high]).

Old log-probabilities: with `keep_copy` (the default) the generator keeps its own copy of the
policy loaded with the synced weights, exposed as `.model` like HFGenerator's, so the one-step
off-policy batch source scores its tokens under the weights that sampled them
(model/rl_batches.py), with the trainer's numerics: the gap between those and vLLM's log-probs of
the same tokens is the sampler/trainer mismatch the objective logs (`logprob_mismatch`).

Determinism: every request carries the step's seed (vLLM's per-request seed), so a rerun samples
the same tokens up to vLLM's batch-dependent kernel numerics. trl is imported only for "nccl";
nothing here imports vllm.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Literal

import torch

from stagewise.model.objectives.grpo import token_logprobs
from stagewise.model.rollout import Rollout
from stagewise.model.vllm_client import VLLMClient

INSTALL_HINT = (
    "pip install 'stagewise[gpu]' (it brings trl and vllm), then start the server on the GPU machine: "
    "`trl vllm-serve --model <checkpoint> --port 8000` (or `VLLM_SERVER_DEV_MODE=1 vllm serve <checkpoint> "
    "--weight-transfer-config '{\"backend\": \"nccl\"}' --logprobs-mode processed_logprobs --max-logprobs -1`)")


def _client_class():
    """TRL's VLLMClient, or a RuntimeError saying how to get it."""
    try:
        from trl.generation.vllm_client import VLLMClient  # noqa: PLC0415 (optional: trl is in the gpu extra (vLLM weight sync))
    except ImportError as err:
        raise RuntimeError(f"the vllm rollout backend needs TRL's VLLMClient ({err}): {INSTALL_HINT}") from err
    return VLLMClient


def rollouts_from_server(prompts: list[list[int]], n: int, output: dict[str, Any],
                         end_ids: Iterable[int]) -> list[list[Rollout]]:
    """VLLMClient.generate's answer -> n Rollouts per prompt (see the module docstring).

    Raises ValueError when the answer does not fit the request (count of responses, missing
    log-probabilities, a sampled token absent from its position's log-probabilities)."""
    completions = output.get("completion_ids")
    if completions is None or len(completions) != len(prompts) * n:
        got = "none" if completions is None else len(completions)
        raise ValueError(f"vLLM server answered {got} completions for {len(prompts)} prompts x n={n}")
    logprobs, logprob_ids = output.get("logprobs"), output.get("logprob_token_ids")
    if logprobs is None or logprob_ids is None:
        raise ValueError("vLLM server returned no log-probabilities: the request must ask for logprobs=0")
    ends = set(end_ids)
    out: list[list[Rollout]] = [[] for _ in prompts]
    for k, tokens in enumerate(completions):
        cut = next((j for j, t in enumerate(tokens) if t in ends), None)
        length = len(tokens) if cut is None else cut + 1
        values = []
        for j in range(length):
            ids, lps = logprob_ids[k][j], logprobs[k][j]
            if tokens[j] not in ids:
                raise ValueError(f"vLLM completion {k}, token {j}: sampled id {tokens[j]} has no log-probability "
                                 f"(got ids {ids})")
            value = lps[ids.index(tokens[j])]
            values.append(math.nan if value is None else float(value))
        out[k // n].append(Rollout(prompt_ids=list(prompts[k // n]), response_ids=list(tokens[:length]),
                                   logprobs=values, finished=cut is not None))
    return out


def _from_completions(answer: dict, prompts: int, n: int) -> dict[str, Any]:
    """vLLM's /v1/completions answer (token ids and logprobs=0 asked for) in VLLMClient.generate's shape."""
    choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != prompts * n:
        raise ValueError(f"vLLM server answered {len(choices)} choices for {prompts} prompts x n={n}")
    ids = [list(c.get("token_ids") or []) for c in choices]
    values = [(c.get("logprobs") or {}).get("token_logprobs") for c in choices]
    if any(v is None or len(v) != len(t) for v, t in zip(values, ids)):
        raise ValueError("vLLM server returned no log-probabilities for every token: the request must ask for "
                         "logprobs=0 and return_token_ids")
    return {"completion_ids": ids, "logprobs": [[[v] for v in seq] for seq in values],
            "logprob_token_ids": [[[t] for t in seq] for seq in ids]}


class VLLMGenerator:
    """Rollouts through a running vLLM server (see the module docstring).

    weight_sync "files": `url` is the server (its weights reloaded from `weights_dir`, a temporary
    directory unless given: it must be readable by the server); `server`, a started
    model/vllm_server.py VLLMServer this generator owns, is stopped by `close()`.
    weight_sync "nccl": `client` replaces TRL's VLLMClient (tests, or a client made elsewhere);
    `device` is where the weights are broadcast from (a CUDA device)."""

    def __init__(self, policy: torch.nn.Module, end_ids: list[int], pad_id: int, url: str = "http://127.0.0.1:8000",
                 weight_sync: Literal["files", "nccl"] = "files", weights_dir: str | os.PathLike | None = None,
                 server: Any = None, connection_timeout: float = 0.0, group_port: int = 51216,
                 device: str | torch.device | None = None, keep_copy: bool = True, client: Any = None):
        if weight_sync not in ("files", "nccl"):
            raise ValueError(f"weight_sync must be files or nccl, got {weight_sync!r}")
        self.end_ids, self.pad_id, self.url, self.weight_sync = list(end_ids), pad_id, url, weight_sync
        self.param_names = [name for name, _ in policy.named_parameters()]
        first = next(policy.parameters(), None)
        self.device = torch.device(device) if device is not None else (
            first.device if first is not None else torch.device("cpu"))
        self.server, self.client, self.http = server, None, None
        if weight_sync == "files":
            self.http = VLLMClient(url, who="rollouts")
            self._own_dir = weights_dir is None
            self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="stagewise-vllm-weights-"))
        else:
            self.client = client if client is not None else self._trl_client(url, group_port, connection_timeout)
        self._communicator = False
        self.model = copy.deepcopy(policy).eval().requires_grad_(False) if keep_copy else None

    @staticmethod
    def _trl_client(url: str, group_port: int, connection_timeout: float) -> Any:
        client_class = _client_class()
        try:
            return client_class(base_url=url, group_port=group_port, connection_timeout=connection_timeout)
        except ImportError as err:  # trl is there, vllm is not
            raise RuntimeError(f"the vllm rollout backend: {str(err).rstrip('.')}: {INSTALL_HINT}") from err
        except OSError as err:  # requests' ConnectionError (an OSError) when nothing listens at url
            raise RuntimeError(f"no vLLM server answers at {url} ({err}); start one: {INSTALL_HINT}") from err

    def _parameters(self, state_dict: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """The parameters to send, by name (buffers are the server's own)."""
        missing = [n for n in self.param_names if n not in state_dict]
        if missing:
            raise ValueError(f"sync_weights: the state dict lacks parameters {missing[:5]}")
        return [(n, state_dict[n].detach()) for n in self.param_names]

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Put the parameters into the server, drop its now stale prefix cache, update the scoring copy."""
        tensors = self._parameters(state_dict)
        if self.weight_sync == "files":
            from safetensors.torch import save_file  # noqa: PLC0415 (safetensors comes with transformers)

            self.weights_dir.mkdir(parents=True, exist_ok=True)
            part = self.weights_dir / f".model.safetensors.{os.getpid()}.part"  # the server reads *.safetensors
            save_file({n: t.cpu().contiguous() for n, t in tensors}, str(part))
            os.replace(part, self.weights_dir / "model.safetensors")
            self.http.reload_weights(str(self.weights_dir))
            self.http.reset_prefix_cache()
        else:
            if not self._communicator:
                self.client.init_communicator(device=self.device)
                self._communicator = True
            tensors = [(n, t.to(self.device)) for n, t in tensors]
            metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in tensors]
            self.client.update_named_params(metadata, iter(tensors))
            self.client.reset_prefix_cache()
        if self.model is not None:
            self.model.load_state_dict(state_dict, strict=True)

    @torch.no_grad()
    def token_logprobs(self, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
        """The trainer-style log-probs under the synced weights, from the local copy (keep_copy)."""
        if self.model is None:
            raise RuntimeError("one-step off-policy rollouts need keep_copy=True (the weights that sampled)")

        return token_logprobs(self.model, input_ids.to(self.device), temperature)[0].cpu()

    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Rollout]]:
        if temperature <= 0 and n != 1:
            raise ValueError("greedy decoding (temperature 0) gives one response per prompt: use n=1")
        if not prompts:
            return []
        temperature = max(float(temperature), 0.0)
        if self.weight_sync == "files":
            answer = self.http.completions({
                "prompt": [list(map(int, p)) for p in prompts], "n": n, "temperature": temperature,
                "max_tokens": max_new_tokens, "logprobs": 0, "seed": int(seed), "stop_token_ids": self.end_ids,
                "ignore_eos": True, "return_token_ids": True, "skip_special_tokens": False})
            output = _from_completions(answer, len(prompts), n)
        else:
            output = self.client.generate(
                prompts=[list(p) for p in prompts], n=n, temperature=temperature,
                max_tokens=max_new_tokens, logprobs=0,
                generation_kwargs={"seed": int(seed), "stop_token_ids": self.end_ids})
        return rollouts_from_server(prompts, n, output, self.end_ids)

    def close(self) -> None:
        """Stop the server this generator owns (if any) and remove the weights file it wrote."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.weight_sync == "files":  # a full copy of the weights: gone with the sampler (a temporary dir whole)
            if self._own_dir:
                shutil.rmtree(self.weights_dir, ignore_errors=True)
            else:
                (self.weights_dir / "model.safetensors").unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    self.weights_dir.rmdir()
