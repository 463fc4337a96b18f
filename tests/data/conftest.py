"""Fixtures for the SFT data tests: a small BPE tokenizer that carries the chat template.

Tests get it through the fixture, never `import conftest`.
"""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory):
    """A saved byte-level BPE (600 tokens, trained on demo-world conversations) with the
    special tokens of data/tokenizer.py and data/templates/chat.jinja installed."""
    from data.chat import install_chat_template
    from data.tokenizer import train_bpe
    from data.world.conversations import DOMAINS, domain_conversations

    texts = [json.dumps(c) for d in DOMAINS if d != "long_context" for c in domain_conversations(d, 30, 0, 200)]
    tok = install_chat_template(train_bpe(texts, 600))
    out = tmp_path_factory.mktemp("chat_tokenizer")
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def chat_tokenizer(chat_tokenizer_dir):
    """The tokenizer of chat_tokenizer_dir, loaded back with AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_tokenizer_dir)
