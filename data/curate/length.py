"""Length limits: conversations too long to be useful (or to fit any pack) are dropped early.

Characters are always checked (cheap, tokenizer-free); tokens only when a tokenizer is
given, counted on the chat template's rendering when the tokenizer carries it (what
packing will see: the longest of the conversation's examples, which is the whole
conversation unless the template is not prefix-stable, data/chat_masks.py), else on the
plain conversation text.
"""

from __future__ import annotations

from typing import Any

from stagewise.data.chat import render_examples
from stagewise.data.curate.structural import Rejected
from stagewise.data.curate.text import conversation_text
from stagewise.data.sft_config import CurateConfig


def token_count(conv: dict, tokenizer: Any) -> int:
    """Tokens of the rendered conversation's longest example (template when present, else the plain text)."""
    if getattr(tokenizer, "chat_template", None):
        return max(len(ids) for ids, _ in render_examples(conv, tokenizer))
    return len(tokenizer.encode(conversation_text(conv), add_special_tokens=False))


def check_length(conv: dict, cfg: CurateConfig, tokenizer: Any | None = None) -> None:
    """Raise Rejected too_long_chars / too_long_tokens."""
    if cfg.max_chars is not None:
        chars = len(conversation_text(conv))
        if chars > cfg.max_chars:
            raise Rejected("too_long_chars", f"{chars} characters (max {cfg.max_chars})")
    if cfg.max_tokens is not None and tokenizer is not None:
        tokens = token_count(conv, tokenizer)
        if tokens > cfg.max_tokens:
            raise Rejected("too_long_tokens", f"{tokens} tokens (max {cfg.max_tokens})")
