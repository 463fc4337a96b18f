"""SFT rows as conversations: messages_field, prompt/completion (strings and TRL's message lists),
reasoning and tool calls kept as given, and rows that are no conversation cited by file, row, field."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagewise.data.errors import BadInput
from stagewise.data.row_files import Row, Where
from stagewise.data.sft_config import SFTDataSource
from stagewise.data.sft_rows import CurationInput, conversation


def _src(**kw):
    return SFTDataSource(name="s", path="x", **kw)


def _jsonl_row(data, line=3):
    return Row(Where(Path("d.jsonl"), line, True), data, json.dumps(data))


def _arrow_row(data, row=4):
    return Row(Where(Path("d.parquet"), row, False), data)


USER = {"role": "user", "content": "Compute 3 * 5."}
CALL = {"role": "assistant", "content": "", "reasoning_content": "Use the calculator.",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "calculator", "arguments": {"expression": "3 * 5"}}}]}
TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def test_a_messages_row_is_taken_as_given():
    data = {"id": "a", "tools": [TOOL], "messages": [USER, CALL, {"role": "tool", "content": "15"},
                                                      {"role": "assistant", "content": "15"}]}
    row = _jsonl_row(data)
    assert conversation(row, _src()) is data


def test_messages_field_names_the_column():
    data = {"conversation": [USER, {"role": "assistant", "content": "15"}], "source": "team"}
    assert conversation(_arrow_row(data), _src(messages_field="conversation")) == {
        "source": "team", "messages": [USER, {"role": "assistant", "content": "15"}]}


def test_prompt_completion_strings_become_a_user_and_an_assistant_turn():
    data = {"prompt": "What is 2 + 2?", "completion": "4", "id": 7}
    want = {"id": 7, "messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}
    assert conversation(_jsonl_row(data), _src()) == want  # detected: no messages column
    named = {"question": "What is 2 + 2?", "answer": "4", "id": 7}
    assert conversation(_jsonl_row(named), _src(prompt_field="question", completion_field="answer")) == want


def test_trl_conversational_prompt_completion_keeps_its_messages():
    system = {"role": "system", "content": "Be brief."}
    data = {"prompt": [system, USER], "completion": [CALL], "tools": json.dumps([TOOL])}
    assert conversation(_jsonl_row(data), _src()) == {"tools": [TOOL], "messages": [system, USER, CALL]}


def test_arrow_nulls_are_absent_keys():
    data = {"messages": [{"role": "user", "content": "hi", "reasoning_content": None, "tool_calls": None},
                         {"role": "assistant", "content": "hello", "reasoning_content": "greet", "tool_calls": None}],
            "tools": None}
    assert conversation(_arrow_row(data), _src()) == {
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "hello", "reasoning_content": "greet"}]}


@pytest.mark.parametrize("data, kw, message", [
    ({"text": "hi"}, {}, "d.parquet:row 4: messages: missing, and no prompt/completion columns either (fields: ['text'])"),
    ({"messages": "hi"}, {}, "d.parquet:row 4: messages: expected a list of messages, got str"),
    ({"messages": [USER, "hi"]}, {}, "d.parquet:row 4: messages.1: expected a message object, got str"),
    ({"messages": [{"content": "hi"}]}, {}, "d.parquet:row 4: messages.0.role: missing (keys: ['content'])"),
    ({"messages": [{"role": 1, "content": "hi"}]}, {}, "d.parquet:row 4: messages.0.role: expected a string, got int"),
    ({"prompt": 5, "completion": "4"}, {}, "d.parquet:row 4: prompt: expected a string or a list of messages, got int"),
    ({"q": "hi"}, {"prompt_field": "q", "completion_field": "a"}, "d.parquet:row 4: a: missing (fields: ['q'])"),
    ({"convs": None}, {"messages_field": "convs"},
     "d.parquet:row 4: convs: missing, and no prompt/completion columns either (fields: [])"),
    ({"messages": [USER], "tools": "{not json"}, {}, "d.parquet:row 4: tools: a string that is not JSON"),
    ({"messages": [USER], "tools": {"a": 1}}, {}, "d.parquet:row 4: tools: expected a list of tool definitions, got dict"),
])
def test_rows_that_are_no_conversation_name_file_row_and_field(data, kw, message):
    with pytest.raises(BadInput) as e:
        conversation(_arrow_row(data), _src(**kw))
    assert str(e.value).startswith(message)


def test_prompt_and_completion_fields_go_together():
    with pytest.raises(ValueError, match="prompt_field and completion_field go together"):
        _src(prompt_field="q")


def test_curation_input_keeps_each_row_at_its_position_and_maps_it_back(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    conv = {"messages": [USER, {"role": "assistant", "content": "15"}]}
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "completion": "b"}] * 2), root / "a.parquet")
    (root / "b.jsonl").write_text(json.dumps(conv) + "\n\n{oops\n" + json.dumps(conv) + "\n")
    lines = CurationInput(root, _src())
    fed = list(lines)
    pair = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    assert fed == [pair, pair, json.dumps(conv), "", b"{oops\n", json.dumps(conv)]
    assert [lines.where(n) for n in (1, 2, 3, 5, 6)] == [
        f"{root}/a.parquet:row 0", f"{root}/a.parquet:row 1", f"{root}/b.jsonl:1", f"{root}/b.jsonl:3",
        f"{root}/b.jsonl:4"]


def test_curation_input_drops_every_trace_when_asked(tmp_path):
    """stages.sft.data.reasoning_content: drop. The traces (under each name transformers reads) go; the
    answers, tool calls and the rows without traces stay as they are."""
    traced = {"id": "t", "messages": [USER, {"role": "assistant", "content": "", "reasoning_content": "r1",
                                             "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                                      {"role": "tool", "content": "15"},
                                      {"role": "assistant", "content": "15", "thinking": "r2", "reasoning": "r3"}]}
    plain = {"id": "p", "messages": [USER, {"role": "assistant", "content": "15"}]}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(traced) + "\n" + json.dumps(plain) + "\n")
    kept = [json.loads(line) for line in CurationInput(path, _src())]
    dropped = [json.loads(line) for line in CurationInput(path, _src(), drop_reasoning=True)]
    assert kept == [traced, plain]
    assert dropped == [{"id": "t", "messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "15"},
        {"role": "assistant", "content": "15"}]}, plain]
