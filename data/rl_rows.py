"""RL prompt rows: a compatible subset of NVIDIA NeMo Gym's JSONL rows, read and written losslessly.

A row is one JSON object per line of a JSONL file, or one row of a parquet / Arrow file or a
Hugging Face `datasets` directory (data/row_files.py; the same nested fields as columns and structs):

    {"responses_create_params": {"input": "<prompt>" | [{"role": "user", "content": "..."}, ...],
                                 "tools": [<OpenAI function definitions>]?, ...},
     "expected_answer": ..., "id"?: str | int, "domain"?: str,
     "agent_ref"?: {"type": "responses_api_agents", "name": "..."}, <any other verifier fields>}

This is NeMo Gym's own row shape (the Responses API request under `responses_create_params`,
verifier fields flat beside it), so datasets made for it load here and ours load there. Keys
this project does not know (`agent_ref`, `question`, `options`, request settings such as
`temperature` ...) are kept on the row and written back: `read_rows` then `write_rows` of
rows nobody changed reproduces the file byte for byte (each row remembers its source line and
reuses it while its content is unchanged, so key order, spacing and escapes survive). `id` may
be an int, as some NeMo Gym datasets write it; use `str(row.id)` where a string is needed.

Bad rows raise BadInput naming `<file>:<line>: <field>: <why>` (`<file>:row <i>` in parquet and
Arrow; the CLI exits 2), or with `on_bad_line="skip"` are dropped and logged.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, field_validator

from stagewise.data.chat import prompt_key as _conversation_key
from stagewise.data.errors import BadInput
from stagewise.data.row_files import iter_rows, present

log = logging.getLogger(__name__)


def _content_text(content: Any) -> str | None:
    """A message content as text: a string, or a list of Responses-API parts with `text`
    (`input_text` / `text` parts) joined; None when it is neither."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


class ResponsesCreateParams(BaseModel):
    """The request a policy answers: the prompt (`input`) and the tools it may call. Other
    Responses-API settings (tool_choice, temperature, max_output_tokens ...) are kept as given."""

    model_config = ConfigDict(extra="allow")

    input: str | list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None

    @field_validator("input")
    @classmethod
    def _messages(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("empty prompt")
            return value
        if not value:
            raise ValueError("empty prompt: no messages")
        for i, m in enumerate(value):
            if not isinstance(m.get("role"), str):
                raise ValueError(f"message {i} has no string 'role' (only role/content messages are supported)")
            if _content_text(m.get("content")) is None:
                raise ValueError(f"message {i} content must be a string or a list of text parts")
        return value


class RLRow(BaseModel):
    """One RL prompt with what its verifier needs; unknown keys are kept (extra="allow")."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: ResponsesCreateParams
    id: str | int | None = None
    domain: str | None = None
    expected_answer: Any = None

    _source: tuple[str, str] | None = PrivateAttr(default=None)
    """(the line it was read from, the canonical JSON of what it held): reused while unchanged."""

    def as_json(self) -> dict[str, Any]:
        """The row as a JSON object: the fields it was given (unset defaults left out) and its extra keys."""
        return self.model_dump(mode="json", exclude_unset=True)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)


def _field_path(obj: Any, loc: tuple, missing: bool) -> str:
    """A pydantic error location as the dotted path into the row, without the union-member
    tags pydantic inserts ("id.str" -> "id"): parts that exist in the input, and the last
    part when it names a missing field."""
    parts, node = [], obj
    for i, part in enumerate(loc):
        if (isinstance(node, dict) and part in node) or (
                isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            node = node[part]
            parts.append(str(part))
        elif missing and i == len(loc) - 1:
            parts.append(str(part))
    return ".".join(parts) or "row"


def _located(where: str, obj: Any, e: ValidationError) -> list[str]:
    """One `<where>: <field>: <why>` per bad field, the reasons of a union's members joined."""
    reasons: dict[str, list[str]] = {}
    for err in e.errors():
        why = err["msg"].removeprefix("Value error, ")
        bucket = reasons.setdefault(_field_path(obj, err["loc"], err["type"] == "missing"), [])
        if why not in bucket:
            bucket.append(why)
    return [f"{where}: {field}: {' or '.join(whys)}" for field, whys in reasons.items()]


def row_of(data: dict[str, Any], where: str, line: str | None = None) -> RLRow:
    """A row's fields as an RLRow, or BadInput naming `where` (`<file>:<line>`, `<file>:row <i>`)
    and the field. `line` is the JSONL text it was read from: written back while unchanged."""
    try:
        row = RLRow.model_validate(data)
    except ValidationError as e:
        raise BadInput(_located(where, data, e)) from None
    if line is not None:
        row._source = (line, _canonical(data))
    return row


def read_rows(path: str | Path, *, on_bad_line: Literal["error", "skip"] = "error",
              split: str | None = None) -> list[RLRow]:
    """Every row of a file or directory (data/row_files.py: JSONL, parquet or Arrow; a Hugging Face
    Hub shard folder's `split` or a `datasets` save_to_disk directory; Arrow rows read through
    `present`, nulls as absent keys). A bad row raises BadInput (`<where>: <field>: <why>`), or
    with on_bad_line="skip" is dropped and logged."""
    if on_bad_line not in ("error", "skip"):
        raise BadInput(f"on_bad_line: must be 'error' or 'skip', got {on_bad_line!r}")
    rows, skipped = [], 0

    def bad(message: str) -> None:
        nonlocal skipped
        if on_bad_line == "error":
            raise BadInput(message)
        skipped += 1
        if skipped <= 3:
            log.warning("skipped %s", message)

    for r in iter_rows(path, split, on_bad=lambda b: bad(str(b))):
        try:
            rows.append(row_of(r.data if r.where.is_line else present(r.data), str(r.where), r.line))
        except BadInput as e:
            bad(str(e))
    if skipped:
        log.warning("%s: skipped %d bad row(s)", path, skipped)
    return rows


def row_line(row: RLRow) -> str:
    """The row's JSONL line (no newline): its source line when its content is unchanged since it
    was read, else a fresh `json.dumps` of `as_json()` (UTF-8 kept as is)."""
    obj = row.as_json()
    if row._source is not None and row._source[1] == _canonical(obj):
        return row._source[0]
    return json.dumps(obj, ensure_ascii=False)


def write_rows(path: str | Path, rows: Iterable[RLRow]) -> Path:
    """Write the rows, one JSON object per line, atomically (a temporary sibling renamed into
    place, so a reader never sees half a file); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(row_line(row) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def prompt_messages(row: RLRow) -> list[dict[str, Any]]:
    """The prompt as chat messages for data/templates/chat.jinja: a string input becomes one user
    turn; list items keep their keys except Responses-API `type`, with text-part contents joined."""
    value = row.responses_create_params.input
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    out = []
    for m in value:
        msg = {k: v for k, v in m.items() if k != "type"}
        msg["content"] = _content_text(m.get("content"))
        out.append(msg)
    return out


def prompt_key(row: RLRow) -> str:
    """A stable key of the prompt (its tools and messages), for dedup and held-out splits: the
    same hash data.chat.prompt_key gives the SFT conversation with that prompt."""
    return _conversation_key({"tools": row.responses_create_params.tools, "messages": prompt_messages(row)})


__all__ = ["RLRow", "ResponsesCreateParams", "prompt_key", "prompt_messages", "read_rows", "row_of",
           "row_line", "write_rows"]
