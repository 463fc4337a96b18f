"""SFT conversations as Megatron-Bridge chat rows: the exact JSONL, what is left out, what is refused,
and each row rendering, as Megatron-Bridge's chat preprocessing renders it (messages and tools, no
template variables), to our training text. tests/engines/megatron/test_real_data.py reads them
with the released library itself."""

from __future__ import annotations

import json

import pytest

from stagewise.data.chat import REASONING_OFF_MARKER, render_text
from stagewise.data.sft_assembly import SFTDataError, write_jsonl
from stagewise.engines.megatron.chat_rows import TRAINING_FILE, as_megatron_renders, megatron_text, write_chat_rows

CALL = {"type": "function", "function": {"name": "calc", "arguments": '{"expression": "2 + 3"}'}}
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate", "parameters": {"type": "object"}}}]
TOOL_CONV = {"id": "c1", "tools": TOOLS, "messages": [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5.", "reasoning_content": "The tool said 5."}]}
PLAIN = {"id": "c2", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
LONG = {"id": "c3", "messages": [{"role": "user", "content": "x " * 400}, {"role": "assistant", "content": "y"}]}


def _sample(tmp_path, *convs):
    path = tmp_path / "sample.jsonl"
    write_jsonl(path, [{"domain": "d", "conversation": c} for c in convs])
    return path


def test_rows_are_the_conversations_as_megatron_bridge_reads_them(tmp_path, chat_tokenizer_dir):
    """Reasoning off (both): the system prompt our template writes with it off (its tools block and the
    `reasoning: off` line) is the row's system turn, the tools are not repeated, traces are dropped."""
    out = tmp_path / "rows"
    report = write_chat_rows(_sample(tmp_path, TOOL_CONV, PLAIN), chat_tokenizer_dir, 512, 1.0, 0, out)
    assert report == {"conversations": 2, "dropped": 0, "reasoning_off": 2}
    assert (out / TRAINING_FILE).read_text() == (
        '{"id": "c1", "messages": [{"role": "system", "content": "# Tools\\nCall a tool with <tool_call>{\\"name\\": '
        '..., \\"arguments\\": {...}}</tool_call>. Available tools:\\n<tools>\\n{\\"type\\": \\"function\\", '
        '\\"function\\": {\\"name\\": \\"calc\\", \\"description\\": \\"evaluate\\", \\"parameters\\": '
        '{\\"type\\": \\"object\\"}}}\\n</tools>\\n\\nreasoning: off"}, {"role": "user", "content": "What is 2 + 3?"}, '
        '{"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "calc", '
        '"arguments": "{\\"expression\\": \\"2 + 3\\"}"}}]}, {"role": "tool", "content": "5"}, '
        '{"role": "assistant", "content": "It is 5."}]}\n'
        '{"id": "c2", "messages": [{"role": "system", "content": "reasoning: off"}, {"role": "user", "content": "Hi"}, '
        '{"role": "assistant", "content": "Hello."}]}\n')


def test_a_row_renders_through_the_chat_template_as_our_engine_trains_it(tmp_path, chat_tokenizer, chat_tokenizer_dir):
    write_chat_rows(_sample(tmp_path, TOOL_CONV), chat_tokenizer_dir, 512, 0.0, 0, tmp_path / "rows")
    row = json.loads((tmp_path / "rows" / TRAINING_FILE).read_text())
    assert row == {"id": "c1", "messages": TOOL_CONV["messages"], "tools": TOOLS}  # reasoning on: as written
    # what Megatron-Bridge 0.6.2's tokenize_chat_example hands the template: messages as written, tools, no kwargs
    seen = as_megatron_renders(row)
    assert seen["messages"][1]["content"] is None and isinstance(seen["messages"][1]["tool_calls"][0]["function"]["arguments"], str)
    text = chat_tokenizer.apply_chat_template(seen["messages"], tools=seen["tools"], tokenize=False)
    assert text == megatron_text(row, chat_tokenizer) == render_text(TOOL_CONV, chat_tokenizer, reasoning=True)
    assert "<think>\nThe tool said 5.\n</think>" in text


def test_a_conversation_longer_than_the_pack_is_left_out_as_our_packer_drops_it(tmp_path, chat_tokenizer_dir):
    report = write_chat_rows(_sample(tmp_path, PLAIN, LONG), chat_tokenizer_dir, 64, 0.0, 0, tmp_path / "rows")
    assert report == {"conversations": 1, "dropped": 1, "reasoning_off": 0}
    assert [json.loads(line)["id"] for line in (tmp_path / "rows" / TRAINING_FILE).read_text().splitlines()] == ["c2"]
    with pytest.raises(SFTDataError, match="fits a pack"):
        write_chat_rows(_sample(tmp_path, LONG), chat_tokenizer_dir, 64, 0.0, 0, tmp_path / "none")
    assert not (tmp_path / "none").exists()


def _reasoning_off(row: dict) -> bool:
    first = row["messages"][0]
    return first["role"] == "system" and first["content"].endswith(REASONING_OFF_MARKER)


def test_reasoning_off_is_the_same_seeded_choice_as_our_packing(tmp_path, chat_tokenizer_dir):
    from stagewise.data.chat import reasoning_enabled

    convs = [{**PLAIN, "id": f"p{i}"} for i in range(20)]
    write_chat_rows(_sample(tmp_path, *convs), chat_tokenizer_dir, 512, 0.5, 7, tmp_path / "rows")
    rows = [json.loads(line) for line in (tmp_path / "rows" / TRAINING_FILE).read_text().splitlines()]
    assert [not _reasoning_off(r) for r in rows] == [reasoning_enabled(c, 0.5, 7) for c in convs]
    assert 0 < sum(not _reasoning_off(r) for r in rows) < 20


def test_arguments_are_written_as_given_megatron_bridge_renders_them_so(tmp_path, chat_tokenizer, chat_tokenizer_dir):
    compact = {"type": "function", "function": {"name": "calc", "arguments": '{"expression":"2 + 3"}'}}
    conv = {**TOOL_CONV, "id": "compact", "messages": [*TOOL_CONV["messages"][:1],
                                                       {"role": "assistant", "content": None, "tool_calls": [compact]}]}
    write_chat_rows(_sample(tmp_path, conv), chat_tokenizer_dir, 512, 0.0, 0, tmp_path / "rows")
    row = json.loads((tmp_path / "rows" / TRAINING_FILE).read_text())
    assert row["messages"][1]["tool_calls"] == [compact]
    assert megatron_text(row, chat_tokenizer) == render_text(conv, chat_tokenizer, reasoning=True)


VARIABLE_ONLY = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and enable_thinking "
                 "is defined and not enable_thinking %}<think></think>{% endif %}{{ m.content }}<|im_end|>\n{%- endfor -%}")
"""A template whose reasoning switch is a variable that writes no system prompt: no row can say it off."""


def test_a_switch_no_row_can_carry_is_refused_naming_the_conversation(tmp_path, chat_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
    tok.chat_template = VARIABLE_ONLY
    tok.save_pretrained(tmp_path / "tok")
    with pytest.raises(SFTDataError, match=r"conversation 'c2': no chat row renders"):
        write_chat_rows(_sample(tmp_path, PLAIN), tmp_path / "tok", 512, 1.0, 0, tmp_path / "rows")
    assert not (tmp_path / "rows").exists()


def test_a_written_directory_is_reused(tmp_path, chat_tokenizer_dir):
    first = write_chat_rows(_sample(tmp_path, PLAIN), chat_tokenizer_dir, 512, 0.0, 0, tmp_path / "rows")
    (tmp_path / "sample.jsonl").unlink()  # not read again
    assert write_chat_rows(tmp_path / "sample.jsonl", chat_tokenizer_dir, 512, 0.0, 0, tmp_path / "rows") == first
