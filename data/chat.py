"""Conversations (OpenAI messages format) rendered into token ids and an SFT loss mask.

A conversation is a dict:

    {"id": "...",                                   # optional; used for seeding and prompt keys
     "tools": [{"type": "function", "function": {"name", "description", "parameters"}}],
     "messages": [{"role": "system" | "user" | "assistant" | "tool", "content": str},
                  {"role": "assistant", "content": str | None, "reasoning_content": str,
                   "tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}]}

The one source of truth for the text is the checkpoint's own chat template. A tokenizer we
trained carries none and gets ours, data/templates/chat.jinja (`install_chat_template`), so
that `apply_chat_template` on a saved checkpoint produces exactly what training saw:

    <|im_start|>system\n{system}[\n\n# Tools ...<tools>...</tools>][\n\nreasoning: off]<|im_end|>\n
    <|im_start|>user\n{content}<|im_end|>\n
    <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n{content}[\n]<tool_call>\n{json}\n</tool_call><|im_end|>\n
    <|im_start|>tool\n<tool_response>\n{content}\n</tool_response><|im_end|>\n

`render_examples` asks the template for its `{% generation %}` spans, so the loss mask is
exactly the assistant turns' bodies (reasoning, content, tool calls) and their closing
<|im_end|>: the `<|im_start|>assistant\n` header, system, user and tool turns are context only.

Any other template (a published checkpoint's: Nemotron 3, Qwen3, Llama 3.1) is used as it
is, never replaced by ours. Every stage writes chats through `chat_text`, so the reasoning
switch is the model's own (data/reasoning_switch.py) and tool-call arguments are handed over
in the form the template reads (data/tool_arguments.py); without {% generation %} blocks the
masks are derived from what the template writes per assistant turn and checked exactly, and
a template that rewrites earlier turns (not prefix-stable) gives more than one example per
conversation (data/chat_masks.py): `render_examples` returns them all, `render` the one
sequence of a conversation that needs only one.

Controllable reasoning: with `reasoning=False` every reasoning trace is dropped and the
model's switch is set off; ours ends the system prompt with the line `reasoning: off`
(REASONING_OFF_MARKER; a system turn holding only that line is created when there is none),
so the model learns to answer directly when the marker is present. `reasoning_enabled` picks
which conversations get that treatment: a fixed fraction, chosen by a seeded hash of the
conversation id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from stagewise.data.chat_masks import Example, derived_examples, generation_examples
from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import SwitchSetting, off_call_kwargs, resolve_switch, switched
from stagewise.data.template_call import TemplateCall, has_generation_blocks, template_source
from stagewise.data.tokenizer import load_tokenizer
from stagewise.data.tool_arguments import arguments_form, in_form

TEMPLATE_PATH = Path(__file__).parent / "templates" / "chat.jinja"
ROLES = ("system", "user", "assistant", "tool")
REASONING_OFF_MARKER = "reasoning: off"
"""The last line of the system prompt when reasoning is off."""


def chat_template() -> str:
    """The Jinja chat template's text."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def install_chat_template(tokenizer: Any) -> Any:
    """Set our template on a tokenizer that carries none (one we trained; in place; returns it).
    A tokenizer with a template of its own keeps it: a checkpoint is trained and served with
    its own template. save_pretrained then writes it."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = chat_template()
    return tokenizer


def load_chat_tokenizer(path: str | Path) -> Any:
    """A tokenizer directory (it must define an eos token), with the chat template installed in
    memory when it carries none: what `data pack` and `data profile` render conversations with."""
    return install_chat_template(load_tokenizer(Path(path)))


def install_chat_template_dir(tokenizer_dir: str | Path) -> Path:
    """Install our template into a saved tokenizer directory that carries none (a checkpoint copies
    it from there); a directory whose tokenizer has a template is left byte for byte as it is."""
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if not getattr(tok, "chat_template", None):
        install_chat_template(tok).save_pretrained(str(tokenizer_dir))
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


def chat_text(messages: list[dict], tokenizer: Any, tools: list | None = None, reasoning: bool = True,
              add_generation_prompt: bool = False, switch: SwitchSetting = "auto", name: str = "a chat") -> str:
    """The chat as the tokenizer's own template writes it, `reasoning` said with the model's own
    switch (`switch`: the recipe's tokenizer.reasoning_switch) and tool-call arguments in the
    form the template reads: the one way every stage (SFT, RL prompts, held-out prompts,
    distillation) renders a chat. `name` names it in errors."""
    messages, call = _prepared(messages, tokenizer, tools, reasoning, switch, lambda: name)
    return call.text(messages, add_generation_prompt)


def render_text(conv: dict, tokenizer: Any, reasoning: bool = True, add_generation_prompt: bool = False,
                switch: SwitchSetting = "auto") -> str:
    """The conversation as the template writes it (chat_text, named in errors by its id)."""
    messages, call = _prepared(conv["messages"], tokenizer, conv.get("tools"), reasoning, switch,
                               lambda: _named(conv))
    return call.text(messages, add_generation_prompt)


def render_examples(conv: dict, tokenizer: Any, reasoning: bool = True,
                    switch: SwitchSetting = "auto") -> list[Example]:
    """The conversation's training examples, each (input_ids, assistant_mask): 1 on every supervised
    token. One example, unless the template is not prefix-stable (data/chat_masks.py).

    The tokenizer must carry a template (`install_chat_template`) and be a fast tokenizer when
    the template has no {% generation %} blocks (the spans are checked on character offsets);
    what cannot be masked exactly raises BadInput naming the conversation."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template; call data.chat.install_chat_template first")
    messages, call = _prepared(conv["messages"], tokenizer, conv.get("tools"), reasoning, switch,
                               lambda: _named(conv))
    if has_generation_blocks(template_source(tokenizer, call.tools) or ""):
        return generation_examples(call, messages)
    return derived_examples(call, messages)


def render(conv: dict, tokenizer: Any, reasoning: bool = True,
           switch: SwitchSetting = "auto") -> Example:
    """(input_ids, assistant_mask) of a conversation that trains as one example (every template
    with {% generation %} blocks, every prefix-stable one); BadInput when the template needs
    more (what needs the whole conversation as one sequence cannot train it exactly)."""
    examples = render_examples(conv, tokenizer, reasoning, switch)
    if len(examples) > 1:
        raise BadInput(f"{_named(conv)}: the chat template rewrites earlier turns once later ones follow (not "
                       f"prefix-stable), so it trains as {len(examples)} examples, not one sequence")
    return examples[0]


TURN_PROBE = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]


def turn_end_token(tokenizer: Any) -> str | None:
    """The added token that closes an assistant turn in the tokenizer's template (ChatML's
    <|im_end|>, Llama 3's <|eot_id|>): where generation must stop and what a chat checkpoint's
    generation_config lists among its eos ids. Read off the template by rendering a one-turn
    probe; None without a template, or when the turn ends in no added token."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        prompt = chat_text(TURN_PROBE[:1], tokenizer, add_generation_prompt=True, name="the turn-end probe")
        whole = chat_text(TURN_PROBE, tokenizer, name="the turn-end probe")
    except BadInput:
        return None
    turn = whole[len(prompt):].rstrip() if whole.startswith(prompt) else whole.rstrip()
    ends = [t.content for t in tokenizer.added_tokens_decoder.values() if t.content.strip() and turn.endswith(t.content)]
    return max(ends, key=len) if ends else None


def _named(conv: dict) -> str:
    return f"conversation {conversation_id(conv)!r}"


def _prepared(messages: list[dict], tokenizer: Any, tools: list | None, reasoning: bool, switch: SwitchSetting,
              name: Callable[[], str]) -> tuple[list[dict], TemplateCall]:
    """(messages, call): the messages as the template must see them, and how to call it."""
    resolved = resolve_switch(tokenizer, switch)
    messages, kwargs = switched(messages, resolved, reasoning)
    if any(m.get("tool_calls") for m in messages):
        messages = in_form(messages, arguments_form(tokenizer), name())
    return messages, TemplateCall(tokenizer, tools or None, kwargs, name, off_call_kwargs(resolved))
