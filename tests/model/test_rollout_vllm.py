"""The vLLM rollout backend without a server: the missing-package message of the NCCL path, the
answer -> Rollout conversion on hand-written server answers (VLLMClient.generate's format, and vLLM's
/v1/completions answer put in it), and the requests the NCCL path makes through a recording client.
The files path against a real vLLM server: tests/model/test_vllm_real.py (marked `vllm`)."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from stagewise.model.rollout import Rollout, make_generator
from stagewise.model.rollout.vllm import VLLMGenerator, _from_completions, rollouts_from_server

END, PAD = 2, 0


def _no_trl(monkeypatch):
    """Make `import trl...` fail whether or not trl is installed."""
    for name in ("trl", "trl.generation", "trl.generation.vllm_client"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_trl_the_backend_says_what_to_install_and_how_to_start_the_server(monkeypatch):
    _no_trl(monkeypatch)
    with pytest.raises(RuntimeError) as err:
        make_generator("vllm", torch.nn.Linear(2, 2), [END], PAD, url="http://127.0.0.1:8000", weight_sync="nccl")
    message = str(err.value)
    assert "pip install 'stagewise[gpu]'" in message
    assert "trl vllm-serve --model <checkpoint>" in message and "vllm serve" in message


def test_with_trl_but_without_vllm_the_clients_import_error_becomes_the_same_message(monkeypatch):
    module = types.ModuleType("trl.generation.vllm_client")

    class VLLMClient:  # what TRL's client does when vllm is missing
        def __init__(self, **kwargs):
            raise ImportError("vLLM is not installed. Please install it with `pip install trl[vllm]`.")

    module.VLLMClient = VLLMClient
    for name in ("trl", "trl.generation"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "trl.generation.vllm_client", module)
    with pytest.raises(RuntimeError, match=r"vLLM is not installed.*pip install 'stagewise\[gpu\]'"):
        VLLMGenerator(torch.nn.Linear(2, 2), [END], PAD, weight_sync="nccl")


def _answer(completions, logprobs, logprob_ids=None):
    """A VLLMClient.generate answer: top-1 logprob lists unless given (logprobs=0)."""
    return {"prompt_ids": [], "completion_ids": completions,
            "logprobs": [[[v] for v in seq] for seq in logprobs] if logprob_ids is None else logprobs,
            "logprob_token_ids": [[[t] for t in seq] for seq in completions] if logprob_ids is None else logprob_ids}


def test_server_answer_becomes_n_rollouts_per_prompt_cut_after_the_end_token():
    prompts = [[5, 6], [7]]
    answer = _answer(
        completions=[[9, END, 4, 4], [8, 8, 8], [END], [3, 9, 2, 5]],
        logprobs=[[-0.5, -0.1, -2.0, -2.0], [-1.0, -1.5, -0.25], [-0.01], [-0.7, -0.2, -0.3, -9.0]])
    groups = rollouts_from_server(prompts, 2, answer, [END])
    assert groups == [
        [Rollout([5, 6], [9, END], [-0.5, -0.1], True), Rollout([5, 6], [8, 8, 8], [-1.0, -1.5, -0.25], False)],
        [Rollout([7], [END], [-0.01], True), Rollout([7], [3, 9, END], [-0.7, -0.2, -0.3], True)],
    ]


def test_the_sampled_tokens_logprob_is_picked_among_top_k_and_none_becomes_nan():
    # logprobs=k: each position lists k+1 entries sorted by probability; the sampled one may be second
    answer = _answer(completions=[[4, 6]], logprobs=[[[-0.2, -1.9], [None, -0.4]]],
                     logprob_ids=[[[3, 4], [6, 1]]])
    (only,), = rollouts_from_server([[1]], 1, answer, [END])
    assert only.response_ids == [4, 6] and only.logprobs[0] == -1.9 and math.isnan(only.logprobs[1])
    assert not only.finished


@pytest.mark.parametrize("bad, match", [
    ({"completion_ids": [[1]]}, "1 completions for 1 prompts x n=2"),
    ({"logprobs": None}, "no log-probabilities"),
    ({"logprob_token_ids": [[[7]], [[7]]]}, "sampled id 1 has no log-probability"),
])
def test_an_answer_that_does_not_fit_the_request_is_refused(bad, match):
    answer = _answer([[1], [1]], [[-1.0], [-1.0]]) | bad
    with pytest.raises(ValueError, match=match):
        rollouts_from_server([[3]], 2, answer, [END])


def test_a_completions_answer_is_read_in_index_order_with_each_sampled_tokens_logprob():
    """vLLM's /v1/completions choices (index = prompt * n + sample), token ids and logprobs=0's token_logprobs."""
    answer = {"choices": [
        {"index": 1, "token_ids": [8, 8], "logprobs": {"token_logprobs": [-1.0, None]}},
        {"index": 0, "token_ids": [9, END], "logprobs": {"token_logprobs": [-0.5, -0.1]}},
    ]}
    groups = rollouts_from_server([[5, 6]], 2, _from_completions(answer, 1, 2), [END])
    assert groups[0][0] == Rollout([5, 6], [9, END], [-0.5, -0.1], True)
    assert groups[0][1].response_ids == [8, 8] and math.isnan(groups[0][1].logprobs[1]) and not groups[0][1].finished
    with pytest.raises(ValueError, match="2 choices for 3 prompts x n=1"):
        _from_completions(answer, 3, 1)
    with pytest.raises(ValueError, match="logprobs=0 and return_token_ids"):
        _from_completions({"choices": [{"index": 0, "token_ids": [9], "logprobs": None}]}, 1, 1)


def test_files_sync_needs_no_server_to_be_made_and_an_absent_one_is_named_when_asked():
    gen = VLLMGenerator(torch.nn.Linear(2, 2), [END], PAD, url="http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match=r"rollouts: no vLLM server answers at http://127.0.0.1:9"):
        gen.generate([[5]], n=1, max_new_tokens=2, temperature=1.0, seed=0)
    gen.close()
    assert not gen.weights_dir.exists()  # its temporary weights directory goes with it


class RecordingClient:
    """Answers like VLLMClient and records what it was asked."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    def init_communicator(self, device):
        self.calls.append(("init_communicator", str(device)))

    def update_named_params(self, metadata, named_params):
        self.calls.append(("update_named_params", (metadata, [(n, t.clone()) for n, t in named_params])))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache", None))

    def generate(self, **request):
        self.calls.append(("generate", request))
        k = len(request["prompts"]) * request["n"]
        return _answer([[4, END]] * k, [[-0.3, -0.2]] * k)


def test_generate_sends_token_prompts_with_the_steps_seed_and_the_end_tokens_as_stops():
    client = RecordingClient()
    gen = VLLMGenerator(torch.nn.Linear(2, 2), [END, 11], PAD, client=client, weight_sync="nccl")
    groups = gen.generate([[5, 6], [7]], n=3, max_new_tokens=16, temperature=0.8, seed=1234)
    (_, request), = client.calls
    assert request == {"prompts": [[5, 6], [7]], "n": 3, "temperature": 0.8, "max_tokens": 16, "logprobs": 0,
                       "generation_kwargs": {"seed": 1234, "stop_token_ids": [END, 11]}}
    assert [len(g) for g in groups] == [3, 3] and groups[1][2] == Rollout([7], [4, END], [-0.3, -0.2], True)
    with pytest.raises(ValueError, match="use n=1"):
        gen.generate([[5]], n=2, max_new_tokens=4, temperature=0.0, seed=0)


def test_sync_weights_pushes_parameters_once_connected_and_updates_the_scoring_copy():
    policy = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))  # has buffers too
    client = RecordingClient()
    gen = VLLMGenerator(policy, [END], PAD, client=client, device="cpu", weight_sync="nccl")
    new = {k: v + 1 if v.is_floating_point() else v for k, v in policy.state_dict().items()}
    gen.sync_weights(new)
    gen.sync_weights(new)
    names = [c for c, _ in client.calls]
    assert names == ["init_communicator", "update_named_params", "reset_prefix_cache",
                     "update_named_params", "reset_prefix_cache"]
    metadata, sent = client.calls[1][1]
    assert metadata == [("0.weight", "float32", [3, 2]), ("0.bias", "float32", [3]),
                        ("1.weight", "float32", [3]), ("1.bias", "float32", [3])]  # parameters, no buffers
    assert all(torch.equal(t, new[n]) for n, t in sent)
    assert torch.equal(gen.model.state_dict()["0.weight"], new["0.weight"])  # old log-probs use these weights
    assert not torch.equal(policy.state_dict()["0.weight"], new["0.weight"])  # the policy itself untouched
