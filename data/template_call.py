"""The one place a tokenizer's chat template is called, and what can be read off its source.

Every stage renders chats through data/chat.py, which calls the template here: a template
that cannot render a conversation (a `raise_exception` of its own, a `TypeError` reading a
field in a form it does not expect) is the data's problem, not the program's, so the error
becomes BadInput naming the conversation and the template's reason (exit 2).

What the source tells (data/reasoning_switch.py, data/chat_masks.py): the variables the
template reads from its caller (jinja2's undeclared variables, as transformers computes them
to route kwargs) and whether it marks its assistant spans with `{% generation %}`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from jinja2 import TemplateSyntaxError
from transformers.utils.chat_template_utils import _get_template_variables

from stagewise.data.errors import BadInput

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""The tag transformers looks for before it can return an assistant-token mask."""


def template_source(tokenizer: Any, tools: list | None = None) -> str | None:
    """The template text `apply_chat_template` would use (a named template set picks by `tools`), or None."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    get = getattr(tokenizer, "get_chat_template", None)
    return get(None, tools) if get is not None else tokenizer.chat_template


@lru_cache(maxsize=64)
def template_variables(source: str) -> frozenset[str]:
    """The names the template reads from its caller (kwargs such as `enable_thinking`)."""
    return _get_template_variables(source)


@lru_cache(maxsize=64)
def has_generation_blocks(source: str) -> bool:
    """True when the template marks what an assistant writes with `{% generation %}`."""
    return bool(GENERATION_TAG.search(source))


@dataclass(frozen=True)
class TemplateCall:
    """How one conversation is handed to the template: its tools, the switch's kwargs, the kwargs of the
    model's own reasoning-off generation prompt (None when its switch is not a template variable), and a
    name for errors (computed only when one is raised)."""

    tokenizer: Any
    tools: list | None = None
    kwargs: dict = field(default_factory=dict)
    name: Callable[[], str] = lambda: "a chat"
    off_kwargs: dict | None = None

    def text(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The template's text for `messages`."""
        return self._call(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def off_prompt(self, messages: list[dict]) -> str | None:
        """The template's text for `messages` and its reasoning-off generation prompt, or None without one."""
        if self.off_kwargs is None:
            return None
        return self._call(messages, tokenize=False, add_generation_prompt=True, **{**self.kwargs, **self.off_kwargs})

    def masked(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """(input_ids, mask) from the template's `{% generation %}` spans (transformers maps them to tokens)."""
        out = self._call(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        return list(out["input_ids"]), [int(m) for m in out["assistant_masks"]]

    def _call(self, messages: list[dict], **options: Any) -> Any:
        options = {**self.kwargs, **options}
        try:
            return self.tokenizer.apply_chat_template(messages, tools=self.tools or None, **options)
        except Exception as e:  # whatever the template raises about these messages  # noqa: BLE001
            if isinstance(e, TemplateSyntaxError):
                raise  # the template itself is broken, not this conversation
            raise BadInput(f"{self.name()}: the chat template cannot render it: {type(e).__name__}: {e}") from None
