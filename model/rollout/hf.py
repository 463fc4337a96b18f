"""Rollouts with transformers' `generate` (KV/SSM cache), sampled by our own seeded generator.

Sampling is done by a logits processor: it draws the next token from softmax(logits / T) with
a private `torch.Generator`, records that token's log-probability, and hands `generate` a
score row where only the drawn token is finite, so greedy decoding picks it. Why not
`do_sample=True`: that draws from the process-wide RNG, which a rollout running in a
background thread (one-step off-policy) would share with the trainer, and which a resumed
run could not replay. With a private generator seeded per step the same weights and seed
give the same tokens, in any thread, before or after a resume.

The draw is by inverse CDF: one uniform per row, searched in the row's cumulative
probabilities. `torch.multinomial` gives the same distribution but, on a [128, 4096] score
matrix on 2 CPU cores, took 14 ms a call against 0.9 ms: a fifth of all sampling time in the
demo.

The n samples of one prompt share its prefill: the prompts are run once through all but their
last token, the cache is repeated n times along the batch (`Cache.reorder_cache`, as beam
search does), and `generate` continues from it with the n copies. Prefill was 40% of the
demo's sampling time, most of it spent on the same prompt n times (n = 4 rollouts, 8 for
held-out pass@1).

The generator keeps its own copy of the model (`sync_weights` loads into it), so the
trainer may update the policy while a rollout is being sampled.

`precision="bf16"` samples with a bfloat16 copy (`sync_weights` casts as it copies), the way a
vLLM sampler on a GPU runs bf16 while the trainer keeps fp32: its log-probabilities then differ
from the trainer's by bf16's rounding, which the GRPO objective's masked importance weight
corrects. They still come back as float32 (softmax over the logits cast to float32). Its
`token_logprobs` (π_old for `recompute_old_logprobs`) is trainer-style, so it runs on a second
copy at the policy's own precision, as VLLMGenerator's `keep_copy` does.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch

from stagewise.model import mamba_torch
from stagewise.model.objectives.grpo import token_logprobs
from stagewise.model.rollout import Rollout


class _Sampler:
    """A LogitsProcessor that samples with its own generator and records log-probabilities."""

    def __init__(self, temperature: float, generator: torch.Generator):
        self.temperature, self.generator = temperature, generator
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        cdf = logp.exp().cumsum(-1)
        u = torch.rand((cdf.shape[0], 1), generator=self.generator, dtype=cdf.dtype) * cdf[:, -1:]
        # right=True: the first token whose cumulative mass exceeds u, so a token of probability 0
        # (a flat stretch of the CDF) is never drawn, not even for u = 0
        token = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
        self.logprobs.append(logp.gather(1, token).squeeze(1))
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, token, 0.0)


class HFGenerator:
    """In-process rollouts (see the module docstring)."""

    def __init__(self, policy: torch.nn.Module, end_ids: list[int], pad_id: int, batch_rows: int = 128,
                 device: str | torch.device = "cpu", precision: Literal["trainer", "bf16"] = "trainer"):
        if precision not in ("trainer", "bf16"):
            raise ValueError(f"precision must be trainer or bf16, got {precision!r}")
        mamba_torch.install()  # a worker process unpickles the policy without building it (model/build.py)
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.end_ids, self.pad_id, self.batch_rows = list(end_ids), pad_id, batch_rows
        self.device, self.precision = torch.device(device), precision
        self.model.to(self.device)
        # bf16: the sampling copy is cast, and a copy at the policy's precision scores token_logprobs
        self.scorer = self.model
        if precision == "bf16":
            self.scorer = copy.deepcopy(self.model)
            self.model.to(torch.bfloat16)

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state_dict, strict=True)  # copies, cast to the copy's dtype
        if self.scorer is not self.model:
            self.scorer.load_state_dict(state_dict, strict=True)

    @torch.no_grad()
    def token_logprobs(self, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
        return token_logprobs(self.scorer, input_ids.to(self.device), temperature)[0].cpu()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
                 seed: int) -> list[list[Rollout]]:
        if temperature <= 0 and n != 1:
            raise ValueError("greedy decoding (temperature 0) gives one response per prompt: use n=1")
        generator = torch.Generator(device="cpu").manual_seed(seed)
        out: list[list[Rollout]] = [[] for _ in prompts]
        # similar lengths together: less padding; the order is fixed, so the draws are too. A
        # prompt's n samples are adjacent rows of one batch (they share its prefill).
        order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
        per_batch = max(1, self.batch_rows // n)
        for start in range(0, len(order), per_batch):
            chunk = order[start:start + per_batch]
            rollouts = self._batch([prompts[i] for i in chunk], n, max_new_tokens, temperature, generator)
            for k, i in enumerate(chunk):
                out[i] = rollouts[k * n:(k + 1) * n]
        return out

    def _batch(self, unique: list[list[int]], n: int, max_new_tokens: int, temperature: float,
               generator: torch.Generator) -> list[Rollout]:
        """n samples of each prompt in `unique`, prompt-major (a prompt's samples adjacent)."""
        width = max(len(p) for p in unique)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in unique], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in unique], device=self.device)
        # only where generate decodes with a cache at all (a config may turn it off: then every
        # step reruns the whole sequence, and there is no prefill to share)
        cached = n > 1 and width > 1 and bool(getattr(self.model.generation_config, "use_cache", True))
        shared = {"cache": self._shared_prefill(ids, mask, n)} if cached else {}
        if n > 1:
            ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        prompts = [p for p in unique for _ in range(n)]
        sampler = _Sampler(temperature, generator) if temperature > 0 else None
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
            logits_processor=[sampler] if sampler else None, eos_token_id=self.end_ids, pad_token_id=self.pad_id,
            output_scores=sampler is None, return_dict_in_generate=True, **shared)
        new = out.sequences[:, width:].tolist()
        if sampler is not None:
            logps = torch.stack(sampler.logprobs, 1).tolist() if sampler.logprobs else [[] for _ in prompts]
        else:
            steps = [torch.log_softmax(s.float(), -1) for s in out.scores]
            logps = [[float(steps[t][b, new[b][t]]) for t in range(len(new[b]))] for b in range(len(prompts))]
        rollouts = []
        for b, p in enumerate(prompts):
            cut = next((j for j, t in enumerate(new[b]) if t in self.end_ids), None)
            length = len(new[b]) if cut is None else cut + 1
            rollouts.append(Rollout(prompt_ids=list(p), response_ids=new[b][:length], logprobs=logps[b][:length],
                                    finished=cut is not None))
        return rollouts

    def _shared_prefill(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """The cache of every prompt but its last token, run once per prompt and repeated n times
        along the batch: `generate` then runs only the last prompt token of each of the n copies."""
        # logits_to_keep=1: the prefill's logits are not read (generate scores from the last prompt
        # token on), so the output layer runs on one position, not on the whole prompt
        cache = self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True,
                           logits_to_keep=1).cache
        cache.reorder_cache(torch.arange(len(ids), device=ids.device).repeat_interleave(n))
        return cache
