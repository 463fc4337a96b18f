"""Rollouts from a vLLM server reached through TRL's VLLMClient (GPU; the optional `gpu` extra).

    # a terminal on the GPU machine (TRL's launcher; it runs `vllm serve` with the flags below):
    trl vllm-serve --model runs/tiny/stages/sft-stage2-<hash>/step-<n> --port 8000
    # or vLLM directly:
    VLLM_SERVER_DEV_MODE=1 vllm serve <checkpoint> --port 8000 --weight-transfer-config '{"backend": "nccl"}' \\
        --logprobs-mode processed_logprobs --max-logprobs -1

    gen = VLLMGenerator(policy, end_ids=[im_end], pad_id=0, url="http://127.0.0.1:8000")
    gen.sync_weights(policy.state_dict())     # NCCL broadcast of the parameters into the server
    groups = gen.generate(prompt_ids, n=8, max_new_tokens=16, temperature=1.0, seed=7)

Why these server flags: `--weight-transfer-config` opens the NCCL group the client pushes the
trainer's weights through (`VLLMClient.init_communicator` / `update_named_params`, both from
TRL); `--logprobs-mode processed_logprobs` makes the returned log-probabilities those of the
distribution actually sampled from (after temperature), which is what the GRPO objective's
masked importance sampling compares with the trainer's own log-probabilities.

What the server returns and how it becomes Rollouts (`rollouts_from_server`, a pure
function): `completion_ids` flat and prompt-major (the n responses of prompt 0, then of
prompt 1...), and per token a list of log-probabilities sorted by probability with their
token ids (`logprob_token_ids`); the sampled token's value is the entry whose id is the
token (with `logprobs=0` it is the only one). A response is cut after its first end token
and marked finished (vLLM keeps the stop token in the token ids, as TRL's trainer expects);
without one it hit max_new_tokens. A token vLLM could not score comes back as None and is
kept as NaN: the objective's masked importance sampling drops such a token (NaN is outside
[is_low, is_high]).

Old log-probabilities: with `keep_copy` (the default) the generator keeps its own copy of
the policy loaded with the synced weights, exposed as `.model` like HFGenerator's, so the
one-step off-policy batch source scores its tokens under the weights that sampled them
(model/rl_batches.py). Without it, off-policy batches carry no old_logprobs (ρ = 1 and the
staleness is left to the importance weight).

Determinism: every request carries the step's seed (vLLM's per-request seed), so a rerun
samples the same tokens up to vLLM's batch-dependent kernel numerics. trl and vllm are
imported only when a VLLMGenerator is made; CPU installs never need them.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Iterable

import torch

from stagewise.model.objectives.grpo import token_logprobs
from stagewise.model.rollout import Rollout

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


class VLLMGenerator:
    """Rollouts through a running vLLM server (see the module docstring).

    `client` replaces the VLLMClient (tests, or a client made elsewhere); `device` is where the
    weights are broadcast from (a CUDA device: vLLM's weight transfer is NCCL)."""

    def __init__(self, policy: torch.nn.Module, end_ids: list[int], pad_id: int, url: str = "http://127.0.0.1:8000",
                 connection_timeout: float = 0.0, group_port: int = 51216, device: str | torch.device | None = None,
                 keep_copy: bool = True, client: Any = None):
        self.end_ids, self.pad_id, self.url = list(end_ids), pad_id, url
        self.param_names = [name for name, _ in policy.named_parameters()]
        first = next(policy.parameters(), None)
        self.device = torch.device(device) if device is not None else (
            first.device if first is not None else torch.device("cpu"))
        if client is None:
            client_class = _client_class()
            try:
                client = client_class(base_url=url, group_port=group_port, connection_timeout=connection_timeout)
            except ImportError as err:  # trl is there, vllm is not
                raise RuntimeError(f"the vllm rollout backend: {str(err).rstrip('.')}: {INSTALL_HINT}") from err
            except OSError as err:  # requests' ConnectionError (an OSError) when nothing listens at url
                raise RuntimeError(f"no vLLM server answers at {url} ({err}); start one: {INSTALL_HINT}") from err
        self.client = client
        self._communicator = False
        self.model = copy.deepcopy(policy).eval().requires_grad_(False) if keep_copy else None

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Broadcast the parameters (buffers are the server's own) and drop its now stale prefix cache."""
        if not self._communicator:
            self.client.init_communicator(device=self.device)
            self._communicator = True
        missing = [n for n in self.param_names if n not in state_dict]
        if missing:
            raise ValueError(f"sync_weights: the state dict lacks parameters {missing[:5]}")
        tensors = [(n, state_dict[n].detach().to(self.device)) for n in self.param_names]
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
        output = self.client.generate(
            prompts=[list(p) for p in prompts], n=n, temperature=max(float(temperature), 0.0),
            max_tokens=max_new_tokens, logprobs=0,
            generation_kwargs={"seed": int(seed), "stop_token_ids": self.end_ids})
        return rollouts_from_server(prompts, n, output, self.end_ids)
