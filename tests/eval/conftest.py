"""Fixtures for the eval tests: a tiny randomly initialised NemotronH and a BPE trained on world text.

Random weights are enough: the harness tests check plumbing (tasks load offline, every
metric comes back finite under the expected key), not skill.
"""

from __future__ import annotations

import json

import pytest


def _texts() -> list[str]:
    from stagewise.data.world.arithmetic import arithmetic_texts
    from stagewise.data.world.retrieval import retrieval_texts
    from stagewise.eval.benchmarks import TASKS_DIR

    prompts = [json.loads(line)["prompt"] for f in sorted((TASKS_DIR / "data").glob("*.jsonl")) for line in open(f)]
    return arithmetic_texts(100, 0) + retrieval_texts(10, 0) + prompts


@pytest.fixture(scope="session")
def tiny_lm():
    """(model, tokenizer): the `tiny` preset over a 400-token byte-level BPE."""
    from transformers.utils import logging as hf_logging

    from stagewise.data.tokenizer import train_bpe
    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    hf_logging.set_verbosity_error()
    tokenizer = train_bpe(_texts(), 400)
    model = build_model(ModelConfig(preset="tiny"), len(tokenizer), seed=0)
    return model, tokenizer
