"""The text views of a conversation that the content checks look at.

Content filters (repetition, dedup, length) must not depend on the tokenizer, so they work
on words: runs of word characters or single punctuation marks. Dedup compares a
normalised text (NFKC, lower case, whitespace collapsed) so that trivial re-formatting
does not hide a duplicate.
"""

from __future__ import annotations

import json
import re
import unicodedata

WORD = re.compile(r"\w+|[^\w\s]")
_SPACE = re.compile(r"\s+")


def words(text: str) -> list[str]:
    """Words and punctuation marks, in order."""
    return WORD.findall(text)


def tool_calls_text(message: dict) -> str:
    """An assistant message's tool calls as JSON lines (name and arguments)."""
    out = []
    for call in message.get("tool_calls") or []:
        f = call.get("function", call) if isinstance(call, dict) else {}
        out.append(json.dumps({"name": f.get("name"), "arguments": f.get("arguments")}, sort_keys=True))
    return "\n".join(out)


def assistant_text(message: dict) -> str:
    """What an assistant turn says: reasoning, content and tool calls."""
    parts = [message.get("reasoning_content") or "", message.get("content") or "", tool_calls_text(message)]
    return "\n".join(p for p in parts if p)


def conversation_text(conv: dict, tools: bool = True) -> str:
    """Every message as `role: text` lines, the tool definitions first (unless tools=False).

    Length limits count the tools (they are rendered); dedup leaves them out, since one
    shared tool schema would make every conversation that uses it look alike."""
    lines = [json.dumps(conv["tools"], sort_keys=True)] if tools and conv.get("tools") else []
    for m in conv["messages"]:
        text = assistant_text(m) if m["role"] == "assistant" else (m.get("content") or "")
        lines.append(f"{m['role']}: {text}")
    return "\n".join(lines)


def fold(text: str) -> str:
    """NFKC, lower case: what makes two spellings of a word the same word."""
    return unicodedata.normalize("NFKC", text).lower()


def normalise(text: str) -> str:
    """The folded text, whitespace runs collapsed to one space, stripped (its words are `fold`'s)."""
    return _SPACE.sub(" ", fold(text)).strip()
