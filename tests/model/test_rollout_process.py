"""ProcessGenerator: HF rollouts in a worker process give an in-process HFGenerator's results,
load synced weights, re-raise worker errors, and stop cleanly (model/rollout/process.py).

One worker serves most tests (starting one costs seconds: it imports torch and transformers);
the autouse conftest fixture runs this process with one torch thread, like the worker."""

from __future__ import annotations

import pytest
import torch

from stagewise.model.rollout import make_generator
from stagewise.model.rollout.hf import HFGenerator
from stagewise.model.rollout.process import ProcessGenerator, RemoteTraceback

END, PAD = 3, 0
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [15]]


@pytest.fixture(scope="module")
def _shared():
    holder: dict = {}
    yield holder
    if "gen" in holder:
        holder["gen"].close()


@pytest.fixture
def worker(_shared, model_factory):
    """(the model the shared worker started from, the ProcessGenerator), weights reset to that model's."""
    if "gen" not in _shared:
        model = model_factory(seed=0)
        _shared["model"], _shared["gen"] = model, make_generator("hf-process", model, [END], PAD, threads=1)
    _shared["gen"].sync_weights(_shared["model"].state_dict())
    return _shared["model"], _shared["gen"]


def test_samples_and_logprobs_equal_an_in_process_generator(worker):
    model, gen = worker
    local = HFGenerator(model, [END], PAD)
    for temperature, n in ((1.0, 3), (0.7, 2), (0.0, 1)):
        got = gen.generate(PROMPTS, n, 6, temperature, seed=11)
        assert got == local.generate(PROMPTS, n, 6, temperature, seed=11)
        assert [len(g) for g in got] == [n] * len(PROMPTS)
    assert gen.generate(PROMPTS, 2, 6, 1.0, seed=11) != gen.generate(PROMPTS, 2, 6, 1.0, seed=12)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [8, 9, 20, 21, PAD, PAD]])
    logp = gen.token_logprobs(ids, 1.0)
    assert logp.shape == (2, 5) and torch.equal(logp, local.token_logprobs(ids, 1.0))


def test_synced_weights_take_effect(worker, model_factory):
    model, gen = worker
    other = model_factory(seed=1)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    before = gen.token_logprobs(ids, 1.0)
    gen.sync_weights(other.state_dict())
    after = gen.token_logprobs(ids, 1.0)
    assert not torch.equal(before, after)
    assert torch.equal(after, HFGenerator(other, [END], PAD).token_logprobs(ids, 1.0))
    assert gen.generate(PROMPTS, 2, 5, 1.0, 3) == HFGenerator(other, [END], PAD).generate(PROMPTS, 2, 5, 1.0, 3)


def test_a_worker_error_is_raised_here_with_its_traceback_and_the_worker_keeps_serving(worker):
    model, gen = worker
    with pytest.raises(ValueError, match="greedy decoding") as info:
        gen.generate(PROMPTS, 2, 4, 0.0, seed=1)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback) and "in generate" in cause.text and "hf.py" in cause.text
    with pytest.raises(RuntimeError, match="Missing key"):
        gen.sync_weights({"not.a.weight": torch.zeros(1)})
    assert gen.generate(PROMPTS[:1], 1, 3, 0.0, seed=1) == HFGenerator(model, [END], PAD).generate(
        PROMPTS[:1], 1, 3, 0.0, seed=1)


def test_close_is_idempotent_and_a_closed_or_dead_worker_raises_clearly(model_factory):
    model = model_factory(pattern="M*-")
    with ProcessGenerator(model, [END], PAD) as gen:
        assert gen.generate(PROMPTS[:1], 1, 2, 0.0, seed=0)[0][0].prompt_ids == PROMPTS[0]
        process = gen._process
    assert not process.is_alive() and process.exitcode == 0  # asked to stop, it exited by itself
    gen.close()
    with pytest.raises(RuntimeError, match="closed"):
        gen.generate(PROMPTS, 1, 2, 0.0, seed=0)
    with pytest.raises(RuntimeError, match="closed"):
        gen.sync_weights(model.state_dict())

    dying = ProcessGenerator(model, [END], PAD)
    dying._process.kill()
    dying._process.join()
    with pytest.raises(RuntimeError, match=r"rollout worker \(pid \d+\) died \(exit code -9\) during generate"):
        dying.generate(PROMPTS, 1, 2, 0.0, seed=0)
    with pytest.raises(RuntimeError, match="died"):
        dying.token_logprobs(torch.tensor([[5, 6]]), 1.0)
    dying.close()
    dying.close()


def test_unknown_backends_are_named():
    with pytest.raises(ValueError, match="use hf, hf-process or vllm"):
        make_generator("hf-thread", torch.nn.Linear(2, 2), [END], PAD)
