"""Validation loss: windows, token weighting, and a value computable by hand."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stagewise.eval.validation import validation_loss


class UniformLM(torch.nn.Module):
    """Predicts every token with equal probability: the loss must be ln(vocab)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab))


class CopyLM(torch.nn.Module):
    """Knows the next token of a fixed stream exactly (very confident logits)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids):
        nxt = (input_ids + 1) % self.vocab
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float() * 50.0)


def test_uniform_model_scores_log_vocab():
    streams = {"a": np.arange(100) % 16, "b": np.arange(60) % 16}
    out = validation_loss(UniformLM(16), streams, seq_length=8, max_tokens=1000)
    assert out["loss"] == pytest.approx(math.log(16), rel=1e-6)
    assert out["a_loss"] == pytest.approx(math.log(16), rel=1e-6)


def test_loss_is_token_weighted_over_sources():
    vocab = 16
    rng = np.random.default_rng(0)
    streams = {"easy": np.arange(200) % vocab, "hard": rng.integers(0, vocab, 100)}
    out = validation_loss(CopyLM(vocab), streams, seq_length=8, max_tokens=400)
    assert out["easy_loss"] < 1e-6 and out["hard_loss"] > 10
    # 200 per source: easy gives (200-1)//8 = 24 windows (192 tokens), hard (100-1)//8 = 12 (96)
    expected = (192 * out["easy_loss"] + 96 * out["hard_loss"]) / 288
    assert out["loss"] == pytest.approx(expected, rel=1e-6)


def test_too_short_streams_are_an_error():
    with pytest.raises(ValueError, match="shorter than one sequence"):
        validation_loss(UniformLM(8), {"a": np.arange(5)}, seq_length=8, max_tokens=100)


def test_model_mode_is_restored():
    model = UniformLM(8)
    model.train()
    validation_loss(model, {"a": np.arange(50) % 8}, seq_length=4, max_tokens=50)
    assert model.training
