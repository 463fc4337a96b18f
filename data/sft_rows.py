"""A team's SFT rows as conversations, and the lines curation reads for one source.

    conv = conversation(row, source)          # {"messages": [...], <the row's other columns>}
    lines = CurationInput(path, source)       # curate(lines, ...); lines.where(lineno) -> "x.parquet:row 3"

Rows come from data/row_files.py (JSONL, parquet, Arrow; a Hub shard folder's split or a
`datasets` save_to_disk directory). A row's conversation is, the first that applies:
- `prompt_field` and `completion_field`, when the source names them;
- the `messages_field` column (default `messages`), when the row has it;
- the `prompt` and `completion` columns, when the row has both (TRL's prompt-completion form).
A prompt string becomes a user turn and a completion string an assistant turn; a list is taken as
messages (TRL's conversational form: [system?, user] then [assistant]). The conversation keeps the
row's other columns (`tools`, `id`, ...) and every message key as given: `reasoning_content`,
`tool_calls` with `arguments` a JSON string (OpenAI) or a mapping; the chat template reads them
in the form it needs (data/chat.py). `tools` given as a JSON string, as Hub datasets often store
them (an Arrow column cannot hold free-form JSON schemas), is parsed. Arrow rows are read through
`present` (a null is an absent key); JSONL rows are taken as written.

Checked here is the shape a row must have to be a conversation at all: the field is there,
messages are a list of objects with a string role, a prompt or completion is a string or such a
list, tools a list. A row that fails stops the stage with BadInput `<where>: <field>: <why>`
(exit 2): the source is not what its config says, and no filter should quietly drop it. What a
conversation says (unknown roles, turn order, empty or non-string content, tool calls and their
arguments, repetition, duplicates, length) is curation's to judge and reject (data/curate), and a
JSONL line that is not a JSON object stays curation's `malformed_json` reject.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import REASONING_FIELDS, without_traces
from stagewise.data.row_files import BadLine, Row, Where, iter_rows, present
from stagewise.data.sft_config import SFTDataSource


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _messages(value: Any, field: str, where: Where) -> list[dict]:
    """`value` as a list of messages (objects with a string role), or BadInput naming `field`."""
    if not isinstance(value, list):
        raise BadInput(f"{where}: {field}: expected a list of messages, got {_type(value)}")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadInput(f"{where}: {field}.{i}: expected a message object, got {_type(m)}")
        if "role" not in m:
            raise BadInput(f"{where}: {field}.{i}.role: missing (keys: {sorted(m)[:10]})")
        if not isinstance(m["role"], str):
            raise BadInput(f"{where}: {field}.{i}.role: expected a string, got {_type(m['role'])}")
    return value


def _turns(value: Any, field: str, role: str, where: Where) -> list[dict]:
    """A prompt or completion: a string is one `role` turn, a list is messages as given."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return _messages(value, field, where)
    raise BadInput(f"{where}: {field}: expected a string or a list of messages, got {_type(value)}")


def _tools(value: Any, where: Where) -> Any:
    """The `tools` column: a JSON string parsed to its list; anything else as given, if a list."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise BadInput(f"{where}: tools: a string that is not JSON ({e})") from None
    if not isinstance(value, list):
        raise BadInput(f"{where}: tools: expected a list of tool definitions, got {_type(value)}")
    return value


def conversation(row: Row, source: SFTDataSource) -> dict[str, Any]:
    """The row as a conversation (see the module docstring), or BadInput `<where>: <field>: <why>`.

    A JSONL row already in that form is returned as the same object (its line can be reused)."""
    data = row.data if row.where.is_line else present(row.data)
    where = row.where
    if source.prompt_field is not None:
        pair = (source.prompt_field, source.completion_field)
    elif source.messages_field in data:
        pair = None
    elif "prompt" in data and "completion" in data:
        pair = ("prompt", "completion")
    else:
        raise BadInput(f"{where}: {source.messages_field}: missing, and no prompt/completion columns either "
                       f"(fields: {sorted(data)[:10]})")
    if pair is None:
        messages = _messages(data[source.messages_field], source.messages_field, where)
        consumed = (source.messages_field,)
    else:
        for field in pair:
            if field not in data:
                raise BadInput(f"{where}: {field}: missing (fields: {sorted(data)[:10]})")
        messages = (_turns(data[pair[0]], pair[0], "user", where)
                    + _turns(data[pair[1]], pair[1], "assistant", where))
        consumed = pair
    tools = data.get("tools")
    if consumed == ("messages",) and (tools is None or isinstance(tools, list)):
        return data
    conv = {k: v for k, v in data.items() if k not in consumed and k != "messages"}
    if tools is not None:
        conv["tools"] = _tools(tools, where)
    conv["messages"] = messages
    return conv


def without_reasoning(conv: dict[str, Any]) -> dict[str, Any]:
    """The conversation with every assistant turn's reasoning trace discarded (SFT data's
    `reasoning_content: drop`), or the same object when it has none."""
    messages = conv.get("messages") or []
    if not any(k in m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"
               for k in REASONING_FIELDS):
        return conv
    return {**conv, "messages": without_traces(messages)}


class CurationInput:
    """The lines curate() reads for one source, each at its row's own position: a JSONL row at its
    line (blank lines kept as blanks), a parquet/Arrow row i at i + 1, files one after another.
    So curate's 1-based line numbers map back to where each row is (`where`), for its rejects.
    With `drop_reasoning` every conversation loses its reasoning traces as it is read."""

    def __init__(self, path: str | Path, source: SFTDataSource, drop_reasoning: bool = False):
        self.path, self.source, self.drop_reasoning = Path(path), source, drop_reasoning
        self._starts: list[int] = []
        self._files: list[tuple[Path, bool]] = []
        self._pos = 0

    def __iter__(self) -> Iterator[str | bytes]:
        pending: list[BadLine] = []
        for row in iter_rows(self.path, self.source.split, on_bad=pending.append):
            for bad in pending:
                yield from self._at(bad.where, bad.raw)
            pending.clear()
            conv = conversation(row, self.source)
            if self.drop_reasoning:
                conv = without_reasoning(conv)
            yield from self._at(row.where, row.line if conv is row.data and row.line is not None
                                else json.dumps(conv, ensure_ascii=False))
        for bad in pending:
            yield from self._at(bad.where, bad.raw)

    def _at(self, where: Where, line: str | bytes) -> Iterator[str | bytes]:
        if not self._files or self._files[-1][0] != where.file:
            self._files.append((where.file, where.is_line))
            self._starts.append(self._pos)
        target = self._starts[-1] + (where.row if where.is_line else where.row + 1)
        while self._pos + 1 < target:
            self._pos += 1
            yield ""
        self._pos += 1
        yield line

    def where(self, lineno: int) -> str:
        """Where the row curate numbered `lineno` (1-based, over the whole source) is."""
        i = bisect.bisect_right(self._starts, lineno - 1) - 1
        file, is_line = self._files[i]
        k = lineno - self._starts[i]
        return str(Where(file, k if is_line else k - 1, is_line))
