"""Needle eval: prompt format and lengths, an oracle scores 1.0, a random model near chance,
and the metric keys per length."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stagewise.data.world.retrieval import RetrievalDoc, render_retrieval
from stagewise.eval.needle import build_needle_prompts, needle_eval, render_context
from stagewise.eval.validation import validation_loss


class OracleLM(torch.nn.Module):
    """Knows the true continuation of every prompt: wherever a row still agrees with a true
    sequence it predicts that sequence's next token with a very confident logit."""

    def __init__(self, truths: list[list[int]], vocab: int):
        super().__init__()
        self.truths, self.vocab = truths, vocab

    def forward(self, input_ids, logits_to_keep: int = 0):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for b, row in enumerate(input_ids.tolist()):
            for truth in self.truths:
                agree = 0
                while agree < min(len(row), len(truth)) and row[agree] == truth[agree]:
                    agree += 1
                for t in range(min(agree, len(truth) - 1)):
                    logits[b, t, truth[t + 1]] = 50.0
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_prompt_format_matches_the_world_retrieval_documents():
    pairs = [("abc-1234", "amber 1"), ("xyz-9876", "onyx 22")]
    doc = RetrievalDoc(tuple(pairs), "xyz-9876", "onyx 22")
    assert render_context(pairs, "xyz-9876") + " onyx 22" == render_retrieval(doc)


def test_prompts_fill_the_length_and_place_the_needle_at_depth(tiny_lm):
    _, tok = tiny_lm
    for p in build_needle_prompts(tok, 256, 6, seed=0, depths=(0.0, 1.0)):
        n = len(tok(p.context + p.answer, add_special_tokens=False)["input_ids"])
        assert 0.8 * 256 <= n <= 256
        records = p.context.split("\n")[1:-2]
        key = p.context.split("value of ")[1].split("?")[0]
        where = [i for i, r in enumerate(records) if r.startswith(key + ":")]
        assert where == [0 if p.depth == 0.0 else len(records) - 1]
        assert records[where[0]].endswith(":" + p.answer)
        assert len(p.distractors) == 3 and p.answer not in p.distractors
        assert all(any(r.endswith(":" + d) for r in records) for d in p.distractors)


def test_oracle_scores_one(tiny_lm):
    _, tok = tiny_lm
    lengths = [64, 128]
    truths = [tok(p.context + p.answer, add_special_tokens=False)["input_ids"]
              for n in lengths for p in build_needle_prompts(tok, n, 6, seed=1)]
    out = needle_eval(OracleLM(truths, len(tok)), tok, lengths, n_per_length=6, seed=1)
    assert out["needle/64/accuracy"] == 1.0 and out["needle/128/accuracy"] == 1.0 and out["needle/accuracy"] == 1.0
    assert set(out) == {"needle/64/accuracy", "needle/128/accuracy", "loss/64", "loss/128", "needle/accuracy"}


def test_random_model_is_near_chance_and_losses_are_finite(tiny_lm):
    model, tok = tiny_lm
    out = needle_eval(model, tok, [96], n_per_length=24, seed=0, choices=4)
    assert out["needle/96/accuracy"] <= 0.5  # chance 0.25; an oracle gets 1.0
    assert math.isfinite(out["loss/96"]) and out["loss/96"] > 0.5 * math.log(len(tok))


def test_loss_per_length_uses_the_given_streams(tiny_lm):
    model, tok = tiny_lm
    stream = np.random.default_rng(0).integers(3, len(tok), 2000)
    out = needle_eval(model, tok, [64], n_per_length=2, seed=0, streams={"val": stream}, loss_tokens=512)
    assert out["loss/64"] == pytest.approx(validation_loss(model, {"val": stream}, 64, 512)["loss"])


def test_bad_arguments_are_refused(tiny_lm):
    model, tok = tiny_lm
    with pytest.raises(ValueError):
        needle_eval(model, tok, [], 1, 0)
