"""HFGenerator (model/rollout/hf.py): the inverse-CDF draw and the prefill a prompt's samples share."""

from __future__ import annotations

import random

import pytest
import torch

from stagewise.model.objectives.grpo import token_logprobs
from stagewise.model.rollout.hf import HFGenerator, _Sampler

END = 3


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 200) for _ in range(rng.randrange(2, 9))] for _ in range(count)]


def _cached(model):
    """The fixture's model decodes without a cache (use_cache=False): the shared prefill needs one."""
    model.generation_config.use_cache = True
    return model.eval()


def test_the_draw_follows_the_softmax_of_the_scores():
    probs = torch.tensor([0.05, 0.0, 0.6, 0.0, 0.25, 0.1])
    scores = probs.log().expand(40_000, -1).contiguous()  # -inf where the probability is 0
    sampler = _Sampler(1.0, torch.Generator().manual_seed(0))
    forced = sampler(torch.zeros(40_000, 1, dtype=torch.long), scores)
    tokens = forced.argmax(-1)
    counts = torch.bincount(tokens, minlength=6).float() / 40_000
    assert counts[1] == 0 and counts[3] == 0  # probability 0: never drawn
    # 4 standard errors of a proportion at n = 40k: at most ~0.01
    assert torch.allclose(counts, probs, atol=0.01), counts
    # the recorded log-probability is the drawn token's, and the returned row forces that token
    assert torch.allclose(sampler.logprobs[0], probs.log()[tokens])
    assert torch.isinf(forced).sum(-1).eq(5).all()


def test_the_draw_is_the_same_for_the_same_seed_and_tempered_by_the_temperature():
    scores = torch.randn(64, 50, generator=torch.Generator().manual_seed(1))
    draw = lambda seed, t: _Sampler(t, torch.Generator().manual_seed(seed))(None, scores).argmax(-1)  # noqa: E731
    assert torch.equal(draw(5, 1.0), draw(5, 1.0))
    assert not torch.equal(draw(5, 1.0), draw(6, 1.0))
    assert torch.equal(draw(5, 1e-4), scores.argmax(-1))  # a cold draw is the greedy one


@pytest.mark.parametrize("n", [2, 3])
def test_samples_that_share_a_prefill_continue_each_prompt(model_factory, n):
    model = _cached(model_factory(pattern="M*E-"))
    gen = HFGenerator(model, [END], 0, batch_rows=8)  # 8 // n prompts per batch: several batches
    prompts = _prompts(7)
    greedy = gen.generate(prompts, 1, 6, 0.0, seed=0)  # no sharing at n = 1
    cold = gen.generate(prompts, n, 6, 1e-4, seed=0)  # every one of the n copies decodes greedily
    for one, copies in zip(greedy, cold):
        assert len(copies) == n
        for sample in copies:
            assert sample.response_ids == one[0].response_ids
            assert sample.prompt_ids == one[0].prompt_ids


def test_shared_prefill_log_probs_are_the_trainers(model_factory):
    model = _cached(model_factory(pattern="M*E-"))
    gen = HFGenerator(model, [END], 0)
    prompts = _prompts(6, seed=3)
    groups = gen.generate(prompts, 4, 5, 1.0, seed=11)
    assert groups == gen.generate(prompts, 4, 5, 1.0, seed=11)  # deterministic for a seed
    for group in groups:
        for s in group:
            seq = torch.tensor([s.prompt_ids + s.response_ids])
            with torch.no_grad():
                logp, _ = token_logprobs(model, seq, 1.0)
            trainer = logp[0, len(s.prompt_ids) - 1:]
            assert torch.allclose(trainer, torch.tensor(s.logprobs), atol=1e-4)
