"""Rollouts and teachers through a real vLLM server (vLLM's CPU build, .venv-vllm), against our
in-process references on the same weights.

The server is the session's (tests/conftest.py `vllm_server`: tiny-dense, fp32); the weights it
holds are whatever a test synced last, so each test syncs the weights it compares on first.

Tolerances (fp32 on both sides, different kernels): a sampled token's log-probability within
1e-3 of the trainer's (measured here: mean 1e-6, max 1e-5); greedy answers identical, except that a
divergence is allowed where the trainer's own top two logits at that position are within 1e-4 (a
tie that kernel rounding may break either way: none happened in the runs that set this).
"""

from __future__ import annotations

import pytest
import torch

from stagewise.model.build import load_model
from stagewise.model.objectives.grpo import token_logprobs
from stagewise.model.rollout.hf import HFGenerator
from stagewise.model.rollout.vllm import VLLMGenerator
from stagewise.model.teachers import HFTeacher, VLLMTeacher
from tests.vllm_checks import greedy_agrees, prompts

pytestmark = pytest.mark.vllm

END = 2  # the chat tokenizer's <|eos|>... any id works as a stop: the comparison uses the same ends on both sides


def nudged(policy: torch.nn.Module, seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """Other weights (as an optimizer step would leave), deterministic for `seed`."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in policy.state_dict().items()}


@pytest.fixture(scope="module")
def policy(dense_chat_checkpoint):
    return load_model(dense_chat_checkpoint, device="cpu").eval()


@pytest.fixture(scope="module")
def tokenizer(dense_chat_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(dense_chat_checkpoint)


def test_reloaded_weights_sample_what_the_trainer_would_and_score_tokens_as_it_does(vllm_server, policy, tokenizer):
    ends = [tokenizer.convert_tokens_to_ids("<|im_end|>"), END]
    gen = VLLMGenerator(policy, ends, 0, url=vllm_server.url)
    reference = HFGenerator(policy, ends, 0)
    batch = prompts(tokenizer)
    try:
        for seed in (1, 2):  # two updates: the second must replace the first
            weights = nudged(policy, seed)
            gen.sync_weights(weights)
            reference.sync_weights(weights)
            trainer = gen.model  # the copy that scores old log-probs holds the synced weights
            got = gen.generate(batch, 1, 12, 0.0, seed)
            want = reference.generate(batch, 1, 12, 0.0, seed)
            agree = [greedy_agrees(trainer, p, g[0].response_ids, w[0].response_ids)
                     for p, g, w in zip(batch, got, want)]
            assert all(agree), [i for i, a in enumerate(agree) if not a]
            assert [g[0].finished for g in got] == [w[0].finished for w in want]
            sampled = gen.generate(batch[:8], 4, 12, 1.0, seed)
            # a batch whose prompts overflow one engine step (64 x 4 seeded samples): the CPU build's engine
            # died on it with chunked prefill on (model/vllm_server.py); whole prefills answer it
            wide = gen.generate(batch * 2, 4, 12, 1.0, seed)
            assert [len(g) for g in wide] == [4] * 64
            gaps = []
            for group in sampled:
                for r in group:
                    ids = torch.tensor([r.prompt_ids + r.response_ids])
                    ours = token_logprobs(trainer, ids, 1.0)[0][0, len(r.prompt_ids) - 1:]
                    gaps += (ours - torch.tensor(r.logprobs)).abs().tolist()
            assert len(gaps) >= 32 and max(gaps) < 1e-3, max(gaps)
        first = nudged(policy, 1)
        gen.sync_weights(first)
        again = gen.generate(batch, 1, 12, 0.0, 0)
        reference.sync_weights(first)
        assert [g[0].response_ids for g in again] == [w[0].response_ids for w in reference.generate(batch, 1, 12, 0.0, 0)]
    finally:
        gen.close()


def test_a_teacher_served_by_vllm_scores_as_the_in_process_teacher(vllm_server, policy, tokenizer,
                                                                   dense_chat_checkpoint):
    """Tolerance: 1e-3 per token in fp32 (the server's prompt log-probs against HFTeacher's forward)."""
    gen = VLLMGenerator(policy, [END], 0, url=vllm_server.url, keep_copy=False)
    gen.sync_weights(policy.state_dict())  # the checkpoint's own weights, whatever a test loaded before
    gen.close()
    sequences = [p + tokenizer.encode(f"{i + 3 * i + 1}<|im_end|>", add_special_tokens=False)
                 for i, p in enumerate(prompts(tokenizer, 12))]
    served = VLLMTeacher(vllm_server.url, "math", batch=5).sequence_logprobs(sequences, 1.0)
    local = HFTeacher(str(dense_chat_checkpoint), "math").sequence_logprobs(sequences, 1.0)
    assert [len(s) for s in served] == [len(s) - 1 for s in sequences]
    worst = max(float((a - b).abs().max()) for a, b in zip(served, local))
    assert worst < 1e-3, worst
