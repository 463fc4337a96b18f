"""The generation interface RL and distillation sample through: prompts in, sampled responses out.

    gen = HFGenerator(policy, end_ids=[im_end], pad_id=0)     # CPU (or one GPU): transformers' generate
    gen.sync_weights(policy.state_dict())                      # the weights to sample with
    groups = gen.generate([[...prompt ids...], ...], n=8, max_new_tokens=16, temperature=1.0, seed=7)
    groups[i][j].response_ids, .logprobs, .finished

Every backend returns, per sampled token, the log-probability the *sampling* policy gave it
(at the sampling temperature), because the GRPO objective's masked importance sampling
compares it with the trainer's own log-probability of the same token: the two differ by
numerics (a cached, left-padded decode against a full forward; vLLM's kernels against the
trainer's) and, with one-step off-policy rollouts, by one optimizer step.

Backends: `HFGenerator` (model/rollout/hf.py), in process, deterministic for a given seed (its
own torch.Generator, so a background thread's sampling never touches the global RNG);
`ProcessGenerator` (model/rollout/process.py), the same HFGenerator in a worker process, so
one-step off-policy sampling overlaps training on a CPU instead of sharing the GIL (results
identical to HFGenerator's for the same weights, seed and thread count); both sample at the
trainer's precision or, with `precision="bf16"`, with a bfloat16 copy (recipe key
`rollout.sampler_precision`); and
`VLLMGenerator` (model/rollout/vllm.py, optional extra, lazily imported), a vLLM server started
with TRL's weight-sync flags (its docstring shows how), reached through TRL's VLLMClient, for GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class Rollout:
    """One sampled response to one prompt."""

    prompt_ids: list[int]
    response_ids: list[int]
    """The sampled tokens, up to and including the end token when `finished`."""
    logprobs: list[float] = field(default_factory=list)
    """log π_rollout(token) at the sampling temperature, one per response token."""
    finished: bool = False
    """The response ended with an end token (else it hit max_new_tokens)."""


class Generator(Protocol):
    """What a rollout backend offers."""

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Sample with these weights from now on."""
        ...

    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Rollout]]:
        """`n` samples per prompt (temperature 0: greedy, n must be 1); deterministic for `seed`."""
        ...

    def token_logprobs(self, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
        """Trainer-style log π(target) [n, L-1] (one full forward, no cache) under the weights it
        samples with: one-step off-policy batches carry these as `old_logprobs`."""
        ...


def make_generator(backend: str, policy: torch.nn.Module, end_ids: list[int], pad_id: int, **options) -> Generator:
    """The named backend: "hf" (in process; options `device`, `batch_rows`, `precision`), "hf-process"
    (HF in a worker process; options `threads`, `batch_rows`, `precision`) or "vllm" (a vLLM server
    started as model/rollout/vllm.py says; optional extra). `precision` "bf16" samples with a bfloat16
    copy of the policy (a sampler whose numerics differ from the trainer's, as vLLM's bf16 do)."""
    if backend == "hf":
        from stagewise.model.rollout.hf import HFGenerator  # noqa: PLC0415 (circular: each backend imports this package)

        return HFGenerator(policy, end_ids, pad_id, **options)
    if backend == "hf-process":
        from stagewise.model.rollout.process import ProcessGenerator  # noqa: PLC0415 (circular: each backend imports this package)

        return ProcessGenerator(policy, end_ids, pad_id, **options)
    if backend == "vllm":
        from stagewise.model.rollout.vllm import VLLMGenerator  # noqa: PLC0415 (circular: each backend imports this package)

        return VLLMGenerator(policy, end_ids, pad_id, **options)
    raise ValueError(f"unknown rollout backend {backend!r}: use hf, hf-process or vllm")


__all__ = ["Generator", "Rollout", "make_generator"]
