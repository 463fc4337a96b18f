"""Teachers for on-policy distillation: each scores the student's sampled tokens.

The distillation stage (ALGORITHMS.md section 7) needs, per student sample, the log-probability
one teacher gives each token the student sampled: A_t = log π_T(y_t) - log π_S(y_t). A teacher
here is anything that maps token sequences (prompt + response, no padding) to those per-token
log-probs; the router picks the one teacher of a prompt's domain.

    teachers = TeacherRouter({"math": make_teacher("hf", "math", path=CKPT_A),
                              "code": make_teacher("hf", "code", path=CKPT_B)},
                             routes={"arithmetic": "math", "python": "code"}, default="math")
    logps = teachers.score(domains, sequences, temperature=1.0)   # one tensor of len(s) - 1 per s
    teachers.close()

Backends:

* `HFTeacher`: the checkpoint loaded once in this process (CPU, or one GPU), scored in chunks of
  right-padded rows with one forward each, the same `token_logprobs` the trainer uses; right
  padding cannot change a causal model's earlier positions, so each row is cut back to its own
  length.
* `VLLMTeacher`: a plain vLLM server per teacher (GPU), asked for *prompt log-probabilities*:
  the sequence is sent as a token-id prompt, and vLLM returns log p(s[t] | s[:t]) for every
  prompt token after the first. How the server is started and what exactly was checked about
  its answer is in the class docstring.

Both run the teacher without gradients; nothing here imports Prefect or MLflow.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol

import torch

from stagewise.model.build import load_model
from stagewise.model.objectives.grpo import token_logprobs
from stagewise.model.vllm_client import VLLMClient


class Teacher(Protocol):
    """What the distillation stage needs from a teacher."""

    name: str

    def sequence_logprobs(self, sequences: list[list[int]], temperature: float,
                          score_from: list[int] | None = None) -> list[torch.Tensor]:
        """Per sequence s (prompt + response token ids, no padding), a float32 CPU tensor of
        len(s) - 1: log p(s[t+1] | s[:t+1]) at logits / temperature. With `score_from`, only the
        tokens s[score_from[i]:] (a response) need scoring: a teacher may return 0 for the targets
        before them (the distillation reads response tokens only)."""
        ...

    def close(self) -> None:
        """Release what the teacher holds (weights, connections)."""
        ...


def _check_sequences(sequences: list[list[int]]) -> None:
    for i, s in enumerate(sequences):
        if len(s) == 0:
            raise ValueError(f"sequence {i} is empty: a teacher scores prompt + response tokens")


class HFTeacher:
    """A checkpoint loaded once (model/build.py's load_model), scored in process.

    `chunk` sequences go through one forward: the sequences are ordered by length first (so a
    chunk pads little), right-padded with `pad_id`, scored with
    model.objectives.grpo.token_logprobs under inference mode, and each row is cut back to
    len(s) - 1 and returned in the input order. With `score_from`, the output layer runs on the
    response tokens only (token_logprobs' mask): the prompt is most of a distillation row."""

    def __init__(self, path: str, name: str, device: str = "cpu", chunk: int = 64, pad_id: int = 0):
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.name, self.path, self.device, self.chunk, self.pad_id = name, str(path), torch.device(device), chunk, pad_id
        self.model: torch.nn.Module | None = load_model(path, device=device).eval().requires_grad_(False)

    def sequence_logprobs(self, sequences: list[list[int]], temperature: float,
                          score_from: list[int] | None = None) -> list[torch.Tensor]:
        if self.model is None:
            raise RuntimeError(f"teacher {self.name!r} is closed")
        _check_sequences(sequences)
        out: list[torch.Tensor | None] = [None] * len(sequences)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for start in range(0, len(order), self.chunk):
            rows = order[start:start + self.chunk]
            width = max(len(sequences[i]) for i in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width - 1)) if score_from is not None else None
            for r, i in enumerate(rows):
                ids[r, :len(sequences[i])] = torch.as_tensor(sequences[i], dtype=torch.long)
                if mask is not None:  # target t is token t + 1
                    mask[r, max(score_from[i] - 1, 0):len(sequences[i]) - 1] = 1
            with torch.inference_mode():
                logp, _ = token_logprobs(self.model, ids.to(self.device), temperature,
                                         mask=None if mask is None else mask.to(self.device))
            logp = logp.float().cpu()
            for r, i in enumerate(rows):
                out[i] = logp[r, :len(sequences[i]) - 1].clone()
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self.model = None


def logprobs_from_response(sequence: list[int], response_json: dict[str, Any], choice: int = 0) -> torch.Tensor:
    """log p(sequence[t+1] | sequence[:t+1]) (float32, len - 1) from a vLLM completions answer
    to the token-id prompt `sequence` with `prompt_logprobs` set (see VLLMTeacher).

    `choices[choice]["prompt_logprobs"]` has one entry per prompt token: None for the first,
    then a dict {token id as a string: {"logprob": float, "rank": int, "decoded_token": str}}
    holding at least the actual prompt token. A token absent from its position's dict (or an
    entry without a log-prob) gives NaN: the objective's masked importance sampling drops NaN
    tokens. A list of the wrong length is a ValueError (the answer is not for this sequence)."""
    choices = response_json.get("choices") or []
    if choice >= len(choices):
        raise ValueError(f"vLLM answer has {len(choices)} choices, wanted choice {choice}")
    entries = choices[choice].get("prompt_logprobs")
    if entries is None:
        raise ValueError("vLLM answer carries no prompt_logprobs: the request must set prompt_logprobs "
                         "(and the server must be vLLM's OpenAI-compatible server)")
    if len(entries) != len(sequence):
        raise ValueError(f"vLLM answer has {len(entries)} prompt log-probs for a sequence of {len(sequence)} tokens")
    values = []
    for t in range(1, len(sequence)):
        entry = entries[t] or {}
        found = entry.get(str(sequence[t]), entry.get(sequence[t]))  # JSON keys are strings
        value = found.get("logprob") if isinstance(found, dict) else None
        values.append(math.nan if value is None else float(value))
    return torch.tensor(values, dtype=torch.float32)


class VLLMTeacher:
    """A teacher served by its own plain vLLM server (GPU), reached over HTTP.

    Start one server per teacher on the GPU machine (nothing but the checkpoint is needed: no
    weight sync, the teacher is frozen):

        vllm serve runs/teachers/math --port 8001 --max-logprobs 1
        vllm serve runs/teachers/code --port 8002 --max-logprobs 1

    `--max-logprobs 1` only caps what a client may ask for (vLLM's default, 20, works too);
    give the server a `--max-model-len` of at least the longest prompt + response + 1.

    Each call POSTs {url}/v1/completions with the sequences as token-id prompts, `max_tokens`
    1, `temperature` 1, `prompt_logprobs` 0, `echo` false, and reads each choice's
    `prompt_logprobs` (`logprobs_from_response`). Checked against vLLM's source
    (vllm/entrypoints/openai/completion/protocol.py and serving.py, v1/engine/logprobs.py):
    `CompletionRequest.prompt` accepts a list of token ids or a list of such lists (one choice
    per prompt, choice `index` in prompt order for n = 1) and is not re-tokenized (no BOS is
    added to a token prompt); `prompt_logprobs` is a vLLM extra parameter, 0 meaning "the
    prompt token itself, no top-k"; `CompletionResponseChoice.prompt_logprobs` is
    `list[dict[int, Logprob] | None]`, None at position 0, each dict holding the actual prompt
    token (rank and decoded_token alongside the logprob), its keys strings once in JSON; a -inf
    log-prob is clamped to -9999.0 by the server before it answers.

    Temperature: vLLM's prompt log-probs are those of the unscaled model (its logits before any
    sampling temperature), so only temperature 1.0 is served; any other is a ValueError rather
    than silently mismatched numbers (the HF teacher scales by 1 / temperature).

    `model`: the served model's name (what `vllm serve` was given, or --served-model-name);
    None asks the server (GET /v1/models) and takes its only model. `batch`: sequences per
    request (vLLM batches the prompts of one request itself)."""

    def __init__(self, url: str, name: str, model: str | None = None, timeout_s: float = 600.0, batch: int = 64):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.url, self.name, self.timeout_s, self.batch = url.rstrip("/"), name, timeout_s, batch
        self.client = VLLMClient(self.url, timeout_s, who=f"teacher {name!r}",
                                 hint="; start one: `vllm serve <teacher checkpoint> --port <port> --max-logprobs 1` "
                                      "(or `stagewise serve-model <teacher checkpoint> --port <port>`)")
        if model is not None:
            self.client._model = model
        self.model = self.client.model()

    def sequence_logprobs(self, sequences: list[list[int]], temperature: float,
                          score_from: list[int] | None = None) -> list[torch.Tensor]:
        if temperature != 1.0:
            raise ValueError(f"teacher {self.name!r}: vLLM's prompt log-probs are of the unscaled model "
                             f"(temperature 1.0); got temperature {temperature}")
        _check_sequences(sequences)
        out: list[torch.Tensor] = []
        for start in range(0, len(sequences), self.batch):
            part = [list(map(int, s)) for s in sequences[start:start + self.batch]]
            answer = self.client.completions({
                "prompt": part, "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0, "echo": False})
            choices = answer.get("choices") or []
            if len(choices) != len(part):
                raise ValueError(f"teacher {self.name!r}: vLLM answered {len(choices)} choices for {len(part)} prompts")
            answer = {**answer, "choices": sorted(choices, key=lambda c: c.get("index", 0))}
            out.extend(logprobs_from_response(s, answer, k) for k, s in enumerate(part))
        return out

    def close(self) -> None:
        """Nothing held between requests (the server is the user's to stop)."""


def make_teacher(backend: Literal["hf", "vllm"], name: str, path: str | None = None, url: str | None = None,
                 device: str = "cpu") -> Teacher:
    """An HFTeacher of the checkpoint `path`, or a VLLMTeacher of the server at `url` (its only model)."""
    if backend == "hf":
        if not path:
            raise ValueError(f"teacher {name!r}: the hf backend needs the teacher checkpoint's path")
        return HFTeacher(path, name, device=device)
    if backend == "vllm":
        if not url:
            raise ValueError(f"teacher {name!r}: the vllm backend needs the teacher server's url")
        return VLLMTeacher(url, name)
    raise ValueError(f"teacher {name!r}: unknown backend {backend!r}: use hf or vllm")


class TeacherRouter:
    """domain -> teacher (each prompt is scored by exactly one teacher, by its domain).

    Callable as `router(domains, sequences, temperature)` (= score), the shape
    model/distill_batches.py takes."""

    def __init__(self, teachers: dict[str, Teacher], routes: dict[str, str], default: str | None = None):
        unknown = sorted({t for t in routes.values() if t not in teachers} | (
            {default} if default is not None and default not in teachers else set()))
        if unknown:
            raise ValueError(f"routes name teachers {unknown} that are not defined (teachers: {sorted(teachers)})")
        self.teachers, self.routes, self.default = dict(teachers), dict(routes), default

    def _name_for(self, domain: str) -> str:
        name = self.routes.get(domain, self.default)
        if name is None:
            routes = ", ".join(f"{d} -> {t}" for d, t in sorted(self.routes.items())) or "none"
            raise ValueError(f"no teacher covers domain {domain!r} (routes: {routes}; set a default teacher)")
        return name

    def teacher_for(self, domain: str) -> Teacher:
        return self.teachers[self._name_for(domain)]

    def score(self, domains: list[str], sequences: list[list[int]], temperature: float,
              score_from: list[int] | None = None) -> list[torch.Tensor]:
        """Per sequence, its domain's teacher's log-probs; one sequence_logprobs call per teacher
        (`score_from`: Teacher.sequence_logprobs')."""
        if len(domains) != len(sequences):
            raise ValueError(f"{len(domains)} domains for {len(sequences)} sequences")
        groups: dict[str, list[int]] = {}
        for i, domain in enumerate(domains):
            groups.setdefault(self._name_for(domain), []).append(i)
        out: list[torch.Tensor | None] = [None] * len(sequences)
        for name, idx in groups.items():
            scored = self.teachers[name].sequence_logprobs(
                [sequences[i] for i in idx], temperature,
                score_from=None if score_from is None else [score_from[i] for i in idx])
            if len(scored) != len(idx):
                raise ValueError(f"teacher {name!r} returned {len(scored)} results for {len(idx)} sequences")
            for i, logp in zip(idx, scored):
                out[i] = logp
        return out  # type: ignore[return-value]

    __call__ = score

    def close(self) -> None:
        for teacher in self.teachers.values():
            teacher.close()
