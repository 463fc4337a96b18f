"""Long-context evaluation: key-value retrieval ("needle") accuracy and validation loss per length.

    metrics = needle_eval(model, tokenizer, lengths=[256, 1024, 2048], n_per_length=24, seed=0)
    # {"needle/256/accuracy": ..., "loss/256": ..., ..., "needle/accuracy": mean over lengths}

A needle prompt is a retrieval document in the demo world's format (data/world/retrieval.py:
"Records:", "key: value" lines, "Question: what is the value of KEY?", "Answer: VALUE") grown
to the target token length, with the asked record placed at a chosen depth (a fraction of
the records, cycling through `depths`). Generated here rather than imported, so eval does
not depend on data/; a test checks the two formats agree.

Scoring: multiple choice by log-likelihood. The true value and `choices - 1` distractor
values taken from *other records of the same document* are each scored as the summed
log-probability of their tokens after "Answer:"; the prompt counts as correct when the true
value scores highest. Chosen over greedy decoding because tiny models rarely produce an
exact multi-token string even when they rank the right value first, so decoding reads ~0
for every small model and shows no progress; and because the distractors appear in the
context too, a model can only beat chance (1/choices) by retrieving the value of the
asked key, not by preferring familiar values. Candidates are right-padded (exact for a
causal model) and only the last logits are computed (`logits_to_keep`).

Loss per length: eval/validation.py's `validation_loss` on windows of that length, over
`streams` (held-out token arrays, e.g. validation shards) when given, else over the
needle documents of that length themselves.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

import numpy as np
import torch

from stagewise.eval.validation import validation_loss

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "iris",
         "juniper", "kelp", "lumen", "marble", "nectar", "onyx", "pepper", "quartz", "russet",
         "sable", "tundra", "umber", "velvet", "willow", "xenon", "yarrow", "zephyr"]
"""The value vocabulary of data/world/retrieval.py."""
DEPTHS = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class NeedlePrompt:
    """A retrieval prompt of about `length` tokens and the values to choose from."""

    length: int
    depth: float
    context: str
    """Records, question and "Answer:" (the value follows after a space)."""
    answer: str
    """The true value, with its leading space."""
    distractors: tuple[str, ...]
    """Values of other records in the same context, with leading spaces."""


def _key(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=3)) + "-" + str(rng.randint(1000, 9999))


def render_context(pairs: list[tuple[str, str]], key: str) -> str:
    """data/world/retrieval.py's render_retrieval up to and including "Answer:"."""
    lines = ["Records:", *(f"{k}: {v}" for k, v in pairs)]
    return "\n".join([*lines, f"Question: what is the value of {key}?", "Answer:"])


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _records(rng: random.Random, n: int) -> list[tuple[str, str]]:
    keys: dict[str, None] = {}
    while len(keys) < n:
        keys[_key(rng)] = None
    return [(k, f"{rng.choice(WORDS)} {rng.randint(0, 999)}") for k in keys]


def build_needle_prompt(tokenizer, length: int, depth: float, rng: random.Random, choices: int = 4) -> NeedlePrompt:
    """The longest prompt (context + answer) within `length` tokens, needle at `depth`."""
    pool = _records(rng, 64)
    per_record = max(1.0, len(_encode(tokenizer, render_context(pool, pool[0][0]))) / len(pool))
    pool += _records(rng, int(length / per_record * 1.5) + choices)
    pool = list(dict(pool).items())  # keys unique across both draws

    def size(m: int) -> int:  # tokens of the prompt with m records, +6 standing in for the answer
        return len(_encode(tokenizer, render_context(pool[:m], pool[0][0]))) + 6

    lo, hi = min(choices, len(pool)), len(pool)
    while lo < hi:  # the largest m with size(m) <= length
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(mid) <= length else (lo, mid - 1)
    while True:  # the estimate used a stand-in key and answer: check the real prompt, drop records if over
        pairs = pool[:lo]
        key, value = pairs[round(depth * (len(pairs) - 1))]
        if lo <= choices or len(_encode(tokenizer, render_context(pairs, key) + f" {value}")) <= length:
            break
        lo -= 1
    others = [v for k, v in pairs if v != value]
    distractors = tuple(f" {v}" for v in rng.sample(sorted(set(others)), min(choices - 1, len(set(others)))))
    return NeedlePrompt(length, depth, render_context(pairs, key), f" {value}", distractors)


def build_needle_prompts(tokenizer, length: int, n: int, seed: int, depths=DEPTHS, choices: int = 4) -> list[NeedlePrompt]:
    """`n` prompts of about `length` tokens, depths cycling through `depths`."""
    rng = random.Random(f"needle:{seed}:{length}")
    return [build_needle_prompt(tokenizer, length, depths[i % len(depths)], rng, choices) for i in range(n)]


@torch.no_grad()
def _choose(model, tokenizer, prompt: NeedlePrompt, device: str) -> bool:
    """True when the answer's summed log-probability beats every distractor's."""
    ctx = _encode(tokenizer, prompt.context)
    cands = [_encode(tokenizer, c) for c in (prompt.answer, *prompt.distractors)]
    width = max(len(c) for c in cands)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = torch.tensor([ctx + c + [pad] * (width - len(c)) for c in cands], device=device)
    # Keep the logits of the last width + 1 positions: those that predict the candidate tokens.
    logits = model(input_ids=rows, logits_to_keep=width + 1).logits[:, -(width + 1):-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    scores = [float(logp[i, torch.arange(len(c)), torch.tensor(c, device=device)].sum()) for i, c in enumerate(cands)]
    return scores[0] > max(scores[1:], default=float("-inf"))


def needle_accuracy(model, tokenizer, prompts: list[NeedlePrompt], device: str = "cpu") -> float:
    """Fraction of prompts where the true value ranks first."""
    return sum(_choose(model, tokenizer, p, device) for p in prompts) / max(1, len(prompts))


def _prompt_stream(tokenizer, prompts: list[NeedlePrompt], length: int) -> np.ndarray:
    """The prompts with their answers, eos-separated, repeated until one window of length + 1 fits."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    ids: list[int] = []
    for p in prompts:
        ids += _encode(tokenizer, p.context + p.answer) + [eos]
    stream = np.asarray(ids, dtype=np.int64)
    return np.tile(stream, -(-(length + 1) // len(stream))) if len(stream) < length + 1 else stream


def needle_eval(model, tokenizer, lengths: list[int], n_per_length: int, seed: int, *, depths=DEPTHS,
                choices: int = 4, streams: dict[str, np.ndarray] | None = None, loss_tokens: int | None = None,
                batch_size: int = 4, device: str = "cpu") -> dict[str, float]:
    """`needle/<len>/accuracy` and `loss/<len>` for every length, and `needle/accuracy` (their mean).

    `loss_tokens` caps the tokens scored per length (default n_per_length × length).
    """
    if not lengths or n_per_length < 1 or choices < 2:
        raise ValueError("needle_eval needs lengths, n_per_length >= 1 and choices >= 2")
    was_training = model.training if hasattr(model, "training") else False
    if hasattr(model, "eval"):
        model.eval()
    try:
        out: dict[str, float] = {}
        for length in sorted(lengths):
            prompts = build_needle_prompts(tokenizer, length, n_per_length, seed, depths, choices)
            out[f"needle/{length}/accuracy"] = needle_accuracy(model, tokenizer, prompts, device)
            source = streams if streams else {"needle": _prompt_stream(tokenizer, prompts, length)}
            budget = loss_tokens or n_per_length * length
            out[f"loss/{length}"] = validation_loss(model, source, length, budget, batch_size, device)["loss"]
        out["needle/accuracy"] = float(np.mean([out[f"needle/{n}/accuracy"] for n in lengths]))
        return out
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
