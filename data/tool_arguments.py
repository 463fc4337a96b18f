"""Tool-call `arguments` in the form the chat template reads: a mapping, or a JSON string.

Our rows carry OpenAI-style calls, `arguments` a JSON string. Templates differ: Llama 3.1's
writes `arguments | tojson` (a string comes out quoted and escaped), Nemotron 3's and
Qwen3-Coder's iterate `arguments | items` (a string raises `TypeError: Can only get item
pairs from a mapping`), others write a string as is, and some (ours) accept both.

Which form a template reads is found once per tokenizer by a trial render of one probe call
in each form, {"probe_key": "probe_value"} as a mapping and as its json.dumps string:
- only one form renders: that form;
- both render the same text: either (the rows are handed over as they are);
- both render, differently: the string form when only its text holds the JSON
  `{"probe_key": "probe_value"}` (a template that writes the string as is), else the mapping
  (what transformers documents for tool calls);
- neither renders (a template without tool calls): as given, and a conversation with calls
  then fails to render, naming itself.

Conversion: a string the template must read as a mapping is parsed (json.loads), and one
that is not a JSON object is BadInput naming the conversation, the message and the call; a
mapping the template must read as a string is written by json.dumps (ensure_ascii=False).
"""

from __future__ import annotations

import json
import weakref
from typing import Any, Literal

from stagewise.data.errors import BadInput
from stagewise.data.template_call import TemplateCall, template_source

Form = Literal["mapping", "string", "either"]
PROBE_ARGS = {"probe_key": "probe_value"}
PROBE_TOOLS = [{"type": "function", "function": {"name": "probe_tool", "description": "A probe.", "parameters": {
    "type": "object", "properties": {"probe_key": {"type": "string"}}, "required": ["probe_key"]}}}]
_FORMS: "weakref.WeakKeyDictionary[Any, tuple[str | None, Form]]" = weakref.WeakKeyDictionary()


def arguments_form(tokenizer: Any) -> Form:
    """The form the tokenizer's template reads `arguments` in (see the module docstring); cached per template."""
    source = template_source(tokenizer, PROBE_TOOLS)
    cached = _FORMS.get(tokenizer)
    if cached is not None and cached[0] == source:
        return cached[1]
    mapping, string = _trial(tokenizer, dict(PROBE_ARGS)), _trial(tokenizer, json.dumps(PROBE_ARGS))
    if mapping == string:
        form: Form = "either"
    elif mapping is None or string is None:
        form = "string" if mapping is None else "mapping"
    else:
        written = json.dumps(PROBE_ARGS)
        form = "string" if written in string and written not in mapping else "mapping"
    _FORMS[tokenizer] = (source, form)
    return form


def _trial(tokenizer: Any, arguments: Any) -> str | None:
    call = {"type": "function", "id": "call_probe", "function": {"name": "probe_tool", "arguments": arguments}}
    messages = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        return TemplateCall(tokenizer, PROBE_TOOLS).text(messages)
    except BadInput:
        return None


def in_form(messages: list[dict], form: Form, name: str) -> list[dict]:
    """`messages` with every assistant tool call's arguments in `form` (copies where changed).
    `name` names the conversation in errors."""
    if form == "either":
        return messages
    out = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if calls:
            m = {**m, "tool_calls": [_call_in_form(c, form, f"{name}: message {i}, tool call {k}")
                                     for k, c in enumerate(calls)]}
        out.append(m)
    return out


def _call_in_form(call: Any, form: Form, where: str) -> Any:
    if not isinstance(call, dict):
        return call
    nested = isinstance(call.get("function"), dict)
    f = call["function"] if nested else call
    if "arguments" not in f:
        return call
    args = f["arguments"]
    if form == "mapping" and isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as e:
            raise BadInput(f"{where}: arguments are not JSON ({e}), and the chat template reads them as a "
                           "mapping") from None
        if not isinstance(args, dict):
            raise BadInput(f"{where}: arguments are JSON but not an object ({type(args).__name__}), and the chat "
                           "template reads them as a mapping")
    elif form == "string" and not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    else:
        return call
    return {**call, "function": {**f, "arguments": args}} if nested else {**f, "arguments": args}
