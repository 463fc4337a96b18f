"""Teachers (model/teachers.py): the HF teacher equals a plain forward whatever the padding, the
router sends each sequence to its domain's teacher once, and the vLLM teacher reads vLLM's
prompt log-probs (pure parsing, and against a local fake server)."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from stagewise.model.build import load_model
from stagewise.model.objectives.grpo import token_logprobs
from stagewise.model.teachers import HFTeacher, TeacherRouter, VLLMTeacher, logprobs_from_response, make_teacher

SEQS = [[5, 9, 200, 17, 3], [7, 7], [100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [42, 43, 44]]


@pytest.fixture(scope="module")
def teacher_ckpt(tmp_path_factory):
    """A saved tiny NemotronH (Mamba-2, attention, MoE, MLP layers) that load_model reads."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    cfg = NemotronHConfig(
        vocab_size=256, hidden_size=64, hybrid_override_pattern="M*E-", num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1,
        chunk_size=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        moe_shared_expert_intermediate_size=64, max_position_embeddings=512, use_cache=False)
    cfg.architectures = ["NemotronHForCausalLM"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = NemotronHForCausalLM(cfg)
    out = tmp_path_factory.mktemp("teacher")
    model.save_pretrained(out)
    return out


def single_row(model, seq, temperature):
    with torch.inference_mode():
        return token_logprobs(model, torch.tensor([seq]), temperature)[0][0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_teacher_equals_an_unpadded_single_row_forward(teacher_ckpt, temperature):
    teacher = HFTeacher(str(teacher_ckpt), "t", chunk=3)
    got = teacher.sequence_logprobs(SEQS, temperature)
    reference = load_model(teacher_ckpt).eval()
    assert [g.shape for g in got] == [(len(s) - 1,) for s in SEQS]
    for seq, g in zip(SEQS, got):
        assert g.dtype == torch.float32 and g.device.type == "cpu"
        assert torch.allclose(g, single_row(reference, seq, temperature), atol=1e-5)
        assert (g <= 0).all() and not g.is_inference()  # usable in autograd code downstream
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_hf_teacher_scores_the_response_alone_when_told_where_it_starts(teacher_ckpt):
    teacher = HFTeacher(str(teacher_ckpt), "t", chunk=3)
    starts = [3, 1, 6, 2]  # index of each sequence's first response token
    full, cut = teacher.sequence_logprobs(SEQS, 0.7), teacher.sequence_logprobs(SEQS, 0.7, score_from=starts)
    for f, c, start in zip(full, cut, starts):
        assert c.shape == f.shape
        assert torch.allclose(c[start - 1:], f[start - 1:], atol=1e-5)  # target t is token t + 1
        assert c[:start - 1].abs().sum() == 0
    router = TeacherRouter({"t": teacher}, {"a": "t"})
    routed = router.score(["a"] * len(SEQS), SEQS, 0.7, score_from=starts)
    assert all(torch.equal(r, c) for r, c in zip(routed, cut))


def test_hf_teacher_padding_and_chunking_do_not_change_scores(teacher_ckpt):
    teacher = HFTeacher(str(teacher_ckpt), "t", chunk=64)
    together = teacher.sequence_logprobs(SEQS, 1.0)
    alone = [teacher.sequence_logprobs([s], 1.0)[0] for s in SEQS]
    teacher.chunk = 1
    one_per_chunk = teacher.sequence_logprobs(SEQS, 1.0)
    teacher.chunk, teacher.pad_id = 2, 255  # another pad id: padding after a row's end is never seen
    other_pad = teacher.sequence_logprobs(SEQS[::-1], 1.0)[::-1]
    for a, b, c, d in zip(together, alone, one_per_chunk, other_pad):
        assert torch.allclose(a, b, atol=1e-5) and torch.allclose(a, c, atol=1e-5) and torch.allclose(a, d, atol=1e-5)


def test_hf_teacher_refuses_empty_sequences_and_use_after_close(teacher_ckpt):
    teacher = make_teacher("hf", "t", path=str(teacher_ckpt))
    assert isinstance(teacher, HFTeacher)
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        teacher.sequence_logprobs([[1, 2], []], 1.0)
    assert teacher.sequence_logprobs([[9]], 1.0)[0].shape == (0,)
    teacher.close()
    with pytest.raises(RuntimeError, match="closed"):
        teacher.sequence_logprobs([[1, 2]], 1.0)


def test_make_teacher_needs_its_location():
    with pytest.raises(ValueError, match="needs the teacher checkpoint"):
        make_teacher("hf", "t")
    with pytest.raises(ValueError, match="needs the teacher server's url"):
        make_teacher("vllm", "t", path="x")
    with pytest.raises(ValueError, match="unknown backend 'trt'"):
        make_teacher("trt", "t", path="x")  # type: ignore[arg-type]


class FakeTeacher:
    """Scores token t as -t / 1000 and records every call."""

    def __init__(self, name: str):
        self.name, self.calls, self.closed = name, [], False

    def sequence_logprobs(self, sequences, temperature, score_from=None):
        self.calls.append(([list(s) for s in sequences], temperature))
        self.score_from = score_from
        return [torch.tensor([-t / 1000 for t in s[1:]]) for s in sequences]

    def close(self):
        self.closed = True


def test_router_calls_each_teacher_once_with_its_domains_sequences_in_order():
    math_t, code_t = FakeTeacher("math"), FakeTeacher("code")
    router = TeacherRouter({"math": math_t, "code": code_t}, routes={"arith": "math", "algebra": "math", "py": "code"})
    domains = ["py", "arith", "algebra", "py", "arith"]
    seqs = [[1, 10], [2, 20, 21], [3, 30], [4, 40, 41, 42], [5, 50]]
    out = router(domains, seqs, 0.8)
    assert math_t.calls == [([[2, 20, 21], [3, 30], [5, 50]], 0.8)]
    assert code_t.calls == [([[1, 10], [4, 40, 41, 42]], 0.8)]
    assert math_t.score_from is None and code_t.score_from is None
    router(domains, seqs, 0.8, score_from=[1, 2, 1, 3, 1])  # each teacher gets its sequences' starts
    assert math_t.score_from == [2, 1, 1] and code_t.score_from == [1, 3]
    for s, logp in zip(seqs, out):  # input order restored
        assert torch.equal(logp, torch.tensor([-t / 1000 for t in s[1:]]))
    assert router.teacher_for("py") is code_t
    router.close()
    assert math_t.closed and code_t.closed


def test_router_unrouted_domain_is_an_error_unless_a_default_covers_it():
    math_t, code_t = FakeTeacher("math"), FakeTeacher("code")
    router = TeacherRouter({"math": math_t, "code": code_t}, routes={"arith": "math"})
    with pytest.raises(ValueError, match=r"no teacher covers domain 'poetry' \(routes: arith -> math; set a default"):
        router.score(["arith", "poetry"], [[1, 2], [3, 4]], 1.0)
    assert math_t.calls == [] and code_t.calls == []  # nothing scored before the error
    with_default = TeacherRouter({"math": math_t, "code": code_t}, routes={"arith": "math"}, default="code")
    with_default.score(["arith", "poetry"], [[1, 2], [3, 4]], 1.0)
    assert math_t.calls == [([[1, 2]], 1.0)] and code_t.calls == [([[3, 4]], 1.0)]


def test_router_refuses_routes_to_unknown_teachers():
    with pytest.raises(ValueError, match=r"\['chem'\] that are not defined"):
        TeacherRouter({"math": FakeTeacher("math")}, routes={"arith": "math", "lab": "chem"})
    with pytest.raises(ValueError, match=r"\['bio'\]"):
        TeacherRouter({"math": FakeTeacher("math")}, routes={}, default="bio")


def vllm_answer(sequences, logprob_of, skip=()):
    """A vLLM completions answer with prompt_logprobs, as its server serializes it."""
    choices = []
    for k, seq in enumerate(sequences):
        entries = [None]
        for t in range(1, len(seq)):
            entry = {} if (k, t) in skip else {str(seq[t]): {"logprob": logprob_of(seq[t]), "rank": 3,
                                                             "decoded_token": f"w{seq[t]}"}}
            entry[str((seq[t] + 1) % 256)] = {"logprob": -0.01, "rank": 1, "decoded_token": "top"}  # a top-1 token
            entries.append(entry)
        choices.append({"index": k, "text": "x", "logprobs": None, "finish_reason": "length",
                        "prompt_logprobs": entries})
    return {"id": "cmpl-1", "object": "text_completion", "model": "teacher", "choices": choices}


def test_logprobs_from_response_reads_the_prompt_tokens_entries():
    seq = [11, 12, 13, 14]
    got = logprobs_from_response(seq, vllm_answer([seq], lambda t: -t / 10))
    assert got.dtype == torch.float32 and torch.allclose(got, torch.tensor([-1.2, -1.3, -1.4]))
    handwritten = {"choices": [{"index": 0, "prompt_logprobs": [
        None,
        {"7": {"logprob": -0.25, "rank": 1, "decoded_token": "a"}},
        {"3": {"logprob": -0.5, "rank": 1, "decoded_token": "b"}},  # the prompt token 9 is missing
        {"9": {"logprob": -9999.0, "rank": 40, "decoded_token": "c"}, "1": {"logprob": -0.1, "rank": 1}},
    ]}]}
    got = logprobs_from_response([5, 7, 9, 9], handwritten)
    assert got[0].item() == -0.25 and math.isnan(got[1].item()) and got[2].item() == -9999.0


def test_logprobs_from_response_refuses_answers_for_another_sequence():
    answer = vllm_answer([[1, 2, 3]], lambda t: -1.0)
    with pytest.raises(ValueError, match="3 prompt log-probs for a sequence of 4 tokens"):
        logprobs_from_response([1, 2, 3, 4], answer)
    with pytest.raises(ValueError, match="no prompt_logprobs"):
        logprobs_from_response([1, 2], {"choices": [{"index": 0, "text": ""}]})
    with pytest.raises(ValueError, match="1 choices, wanted choice 1"):
        logprobs_from_response([1, 2, 3], answer, choice=1)


@pytest.fixture
def fake_vllm():
    """A local HTTP server answering /v1/models and /v1/completions as vLLM does; records requests."""
    requests: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status, body):
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "/ckpt/teacher", "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(body)
            if body.get("model") != "/ckpt/teacher":
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                return
            answer = vllm_answer(body["prompt"], lambda t: -t / 100, skip={(0, 2)})
            answer["choices"].reverse()  # order comes from `index`, not position
            self._send(200, answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", requests
    server.shutdown()
    server.server_close()
    thread.join()


def test_vllm_teacher_against_a_fake_server(fake_vllm):
    url, requests = fake_vllm
    teacher = make_teacher("vllm", "math", url=url)
    assert isinstance(teacher, VLLMTeacher) and teacher.model == "/ckpt/teacher"  # the server's only model
    teacher.batch = 2
    seqs = [[10, 20, 30], [40, 50], [60, 70, 80, 90]]
    got = teacher.sequence_logprobs(seqs, 1.0)
    assert [r["prompt"] for r in requests] == [seqs[:2], seqs[2:]]
    assert all(r["prompt_logprobs"] == 0 and r["max_tokens"] == 1 and r["echo"] is False
               and r["temperature"] == 1.0 for r in requests)
    assert torch.allclose(got[0][:1], torch.tensor([-0.2])) and math.isnan(got[0][1].item())  # skipped in batch 1
    assert torch.allclose(got[1], torch.tensor([-0.5]))
    assert math.isnan(got[2][1].item()) and torch.allclose(got[2][[0, 2]], torch.tensor([-0.7, -0.9]))
    teacher.close()


def test_vllm_teacher_refuses_other_temperatures_and_reports_server_errors(fake_vllm):
    url, requests = fake_vllm
    teacher = VLLMTeacher(url, "math")
    with pytest.raises(ValueError, match="unscaled model"):
        teacher.sequence_logprobs([[1, 2, 3]], 0.7)
    assert requests == []
    wrong = VLLMTeacher(url, "math", model="other")
    with pytest.raises(RuntimeError, match="answered 404 to /v1/completions.*`other` does not exist"):
        wrong.sequence_logprobs([[1, 2, 3]], 1.0)
    server_gone = url.rsplit(":", 1)[0] + ":9"  # the discard port: nothing listens there
    with pytest.raises(RuntimeError, match="no vLLM server answers at .* start one: `vllm serve"):
        VLLMTeacher(server_gone, "math", timeout_s=5)
