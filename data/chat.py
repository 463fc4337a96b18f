"""Conversations (OpenAI messages format) rendered into token ids and an SFT loss mask.

A conversation is a dict:

    {"id": "...",                                   # optional; used for seeding and prompt keys
     "tools": [{"type": "function", "function": {"name", "description", "parameters"}}],
     "messages": [{"role": "system" | "user" | "assistant" | "tool", "content": str},
                  {"role": "assistant", "content": str | None, "reasoning_content": str,
                   "tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}]}

The one source of truth for the text is the Jinja template data/templates/chat.jinja,
installed on the tokenizer (`install_chat_template`) so that `apply_chat_template` on a
saved checkpoint produces exactly what training saw:

    <|im_start|>system\n{system}[\n\n# Tools ...<tools>...</tools>][\n\nreasoning: off]<|im_end|>\n
    <|im_start|>user\n{content}<|im_end|>\n
    <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n{content}[\n]<tool_call>\n{json}\n</tool_call><|im_end|>\n
    <|im_start|>tool\n<tool_response>\n{content}\n</tool_response><|im_end|>\n

`render` asks the template for its `{% generation %}` spans, so the loss mask is exactly the
assistant turns' bodies (reasoning, content, tool calls) and their closing <|im_end|>: the
`<|im_start|>assistant\n` header, system, user and tool turns are context only.

Controllable reasoning: with `reasoning=False` the template drops every reasoning trace and
ends the system prompt with the line `reasoning: off` (REASONING_OFF_MARKER; a system turn
holding only that line is created when there is none), so the model learns to answer
directly when the marker is present. `reasoning_enabled` picks which conversations get
that treatment: a fixed fraction, chosen by a seeded hash of the conversation id.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

TEMPLATE_PATH = Path(__file__).parent / "templates" / "chat.jinja"
ROLES = ("system", "user", "assistant", "tool")
REASONING_OFF_MARKER = "reasoning: off"
"""The last line of the system prompt when reasoning is off."""


def chat_template() -> str:
    """The Jinja chat template's text."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def install_chat_template(tokenizer: Any) -> Any:
    """Set the template on a tokenizer (in place; returns it). save_pretrained then writes it."""
    tokenizer.chat_template = chat_template()
    return tokenizer


def load_chat_tokenizer(path: str | Path) -> Any:
    """A tokenizer directory (it must define an eos token), with the chat template installed in
    memory when it carries none: what `data pack` and `data profile` render conversations with."""
    from stagewise.data.tokenizer import load_tokenizer

    tok = load_tokenizer(Path(path))
    return tok if getattr(tok, "chat_template", None) else install_chat_template(tok)


def install_chat_template_dir(tokenizer_dir: str | Path) -> Path:
    """Install the template into a saved tokenizer directory (a checkpoint copies it from there)."""
    from transformers import AutoTokenizer

    tok = install_chat_template(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    tok.save_pretrained(str(tokenizer_dir))
    return Path(tokenizer_dir)


def conversation_id(conv: dict) -> str:
    """The conversation's `id`, else a content hash (stable across processes)."""
    if conv.get("id") is not None:
        return str(conv["id"])
    blob = json.dumps({"messages": conv.get("messages"), "tools": conv.get("tools")}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def prompt_key(conv: dict) -> str:
    """What identifies the prompt: `prompt_id` when given, else a hash of the tools and every
    message before the first assistant turn (two samples answering one prompt share it)."""
    if conv.get("prompt_id") is not None:
        return str(conv["prompt_id"])
    prefix = []
    for m in conv.get("messages", []):
        if m.get("role") == "assistant":
            break
        prefix.append(m)
    blob = json.dumps({"tools": conv.get("tools"), "prefix": prefix}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def unit_hash(seed: int, key: str) -> float:
    """A uniform number in [0, 1) from (seed, key), the same in every process."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def reasoning_enabled(conv: dict, off_fraction: float, seed: int) -> bool:
    """False for a seeded `off_fraction` of conversations (by id): those train without traces."""
    return unit_hash(seed, "reasoning:" + conversation_id(conv)) >= off_fraction


def render_text(conv: dict, tokenizer: Any, reasoning: bool = True, add_generation_prompt: bool = False) -> str:
    """The conversation as the template writes it."""
    return tokenizer.apply_chat_template(conv["messages"], tools=conv.get("tools") or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, reasoning=reasoning)


def render(conv: dict, tokenizer: Any, reasoning: bool = True) -> tuple[list[int], list[int]]:
    """(input_ids, assistant_mask): the template's tokens and 1 on every supervised token.

    The tokenizer must carry the template (`install_chat_template`) and be a fast tokenizer
    (the mask comes from character offsets)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; call data.chat.install_chat_template first")
    out = tokenizer.apply_chat_template(conv["messages"], tools=conv.get("tools") or None, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True, reasoning=reasoning)
    mask = [int(m) for m in out["assistant_masks"]]
    if not any(mask) and any(m.get("role") == "assistant" for m in conv["messages"]):
        raise ValueError("the chat template marks no assistant tokens: it needs {% generation %} blocks "
                         "(use data.chat.install_chat_template)")
    return list(out["input_ids"]), mask
