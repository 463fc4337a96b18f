"""Structural checks: is the line a well-formed conversation we can render and train on?

Each check raises `Rejected(reason, detail)`; the pipeline records the reason, writes the
line to the rejects file and moves on, so no input line can crash curation. Reasons:

- malformed_json: not UTF-8, not JSON, or not a JSON object
- bad_schema: no non-empty `messages` list, a message that is not an object, a missing or
  non-string role/content, a malformed tool call or tool definition
- unknown_role: a role other than system, user, assistant, tool
- role_order: system not first; the first turn after it not a user turn; two user (or two
  assistant) turns in a row; a tool turn that does not answer a pending tool call; a tool
  call left unanswered; no assistant turn at the end
- empty_assistant: an assistant turn with neither content nor tool calls
- tool_call_without_tools: a tool call in a conversation that defines no tools
- undefined_tool: a tool call naming a tool the conversation does not define
- bad_tool_arguments: tool-call arguments that are not a JSON object
"""

from __future__ import annotations

import json

from stagewise.data.chat import ROLES


class Rejected(Exception):
    """A sample fails a check: `reason` (a short code) and a human `detail`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def parse_line(line: str | bytes) -> dict:
    """The JSON object on one line (raises Rejected malformed_json)."""
    try:
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        obj = json.loads(line)
    except UnicodeDecodeError as e:
        raise Rejected("malformed_json", f"not UTF-8: {e}") from None
    except ValueError as e:
        raise Rejected("malformed_json", str(e)) from None
    if not isinstance(obj, dict):
        raise Rejected("malformed_json", f"a JSON {type(obj).__name__}, not an object")
    return obj


def tool_names(conv: dict) -> set[str]:
    """Names of the tools the conversation defines (OpenAI `{"type", "function": {...}}` or bare)."""
    names = set()
    for tool in conv.get("tools") or []:
        if not isinstance(tool, dict):
            raise Rejected("bad_schema", "a tool definition is not an object")
        f = tool.get("function", tool)
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise Rejected("bad_schema", "a tool definition has no name")
        names.add(f["name"])
    return names


def _check_message(i: int, m: object) -> None:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise Rejected("bad_schema", f"message {i} is not an object with a string role")
    if m["role"] not in ROLES:
        raise Rejected("unknown_role", f"message {i} has role {m['role']!r}")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise Rejected("bad_schema", f"message {i} ({m['role']}) content is not a string")
    if content is None and m["role"] != "assistant":
        raise Rejected("bad_schema", f"message {i} ({m['role']}) has no content")
    if not isinstance(m.get("reasoning_content") or "", str):
        raise Rejected("bad_schema", f"message {i} reasoning_content is not a string")


def _check_tool_calls(i: int, m: dict, defined: set[str]) -> int:
    """Validate an assistant turn's tool calls; returns how many it makes."""
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise Rejected("bad_schema", f"message {i} tool_calls is not a list")
    for call in calls:
        f = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise Rejected("bad_schema", f"message {i} has a tool call without a function name")
        if not defined:
            raise Rejected("tool_call_without_tools", f"message {i} calls {f['name']!r} but no tools are defined")
        if f["name"] not in defined:
            raise Rejected("undefined_tool", f"message {i} calls {f['name']!r}; defined: {sorted(defined)}")
        args = f.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise Rejected("bad_tool_arguments", f"message {i} arguments are not JSON") from None
        if not isinstance(args, dict):
            raise Rejected("bad_tool_arguments", f"message {i} arguments are not a JSON object")
    return len(calls)


def check_structure(conv: dict) -> None:
    """Raise Rejected for the first structural problem of a parsed conversation."""
    messages = conv.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Rejected("bad_schema", "no non-empty `messages` list")
    defined = tool_names(conv)
    for i, m in enumerate(messages):
        _check_message(i, m)
    pending = 0  # tool calls of the last assistant turn still waiting for a result
    prev = None
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "system":
            if i != 0:
                raise Rejected("role_order", f"system turn at position {i} (only the first turn may be system)")
        elif prev in (None, "system") and role != "user":
            raise Rejected("role_order", f"the conversation starts with {role!r}, not a user turn")
        elif role == "tool":
            if pending == 0:
                raise Rejected("role_order", f"tool turn {i} answers no pending tool call")
            pending -= 1
        elif pending:
            raise Rejected("role_order", f"{role} turn {i} comes before the pending tool call(s) were answered")
        elif role == prev:
            raise Rejected("role_order", f"two {role} turns in a row (positions {i - 1}, {i})")
        if role == "assistant":
            pending = _check_tool_calls(i, m, defined)
            if not (m.get("content") or "").strip() and pending == 0:
                raise Rejected("empty_assistant", f"assistant turn {i} has no content and no tool calls")
        prev = role
    if pending:
        raise Rejected("role_order", "the last tool call is never answered")
    if prev != "assistant":
        raise Rejected("role_order", f"the conversation ends with a {prev} turn, not an assistant turn")
