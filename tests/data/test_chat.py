"""Chat template and render(): exact text, mask boundaries by hand, reasoning on/off."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from stagewise.data.chat import REASONING_OFF_MARKER, install_chat_template, reasoning_enabled, render, render_text
from stagewise.data.errors import BadInput

CALL = {"type": "function", "function": {"name": "calc", "arguments": '{"expression": "2 + 3"}'}}
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate", "parameters": {"type": "object"}}}]
CONV = {
    "id": "c1",
    "tools": TOOLS,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "It is 5.", "reasoning_content": "The tool said 5."},
    ],
}
TOOLS_BLOCK = ('# Tools\nCall a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>. Available tools:\n'
               '<tools>\n{"type": "function", "function": {"name": "calc", "description": "evaluate", '
               '"parameters": {"type": "object"}}}\n</tools>')
# Written out by hand from the format documented in data/chat.py.
SUPERVISED = ['<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>',
              "<think>\nThe tool said 5.\n</think>\nIt is 5.<|im_end|>"]
CONTEXT = [f"<|im_start|>system\nBe brief.\n\n{TOOLS_BLOCK}<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
           "<|im_start|>assistant\n",
           "\n<|im_start|>tool\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
           "\n"]


def spans(ids, mask, tok):
    """Decoded runs of equal mask value: [(mask, text), ...]."""
    out, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            out.append((mask[start], tok.decode(ids[start:i])))
            start = i
    return out


def test_text_is_the_documented_format(chat_tokenizer):
    text = render_text(CONV, chat_tokenizer)
    assert text == CONTEXT[0] + SUPERVISED[0] + CONTEXT[1] + SUPERVISED[1] + CONTEXT[2]


def test_mask_boundaries_by_hand(chat_tokenizer):
    ids, mask = render(CONV, chat_tokenizer)
    assert spans(ids, mask, chat_tokenizer) == [(0, CONTEXT[0]), (1, SUPERVISED[0]), (0, CONTEXT[1]),
                                                (1, SUPERVISED[1]), (0, CONTEXT[2])]
    im_start = chat_tokenizer.convert_tokens_to_ids("<|im_start|>")
    im_end = chat_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(m == 0 for i, m in zip(ids, mask) if i == im_start)  # headers are never supervised
    assert [m for i, m in zip(ids, mask) if i == im_end] == [0, 0, 1, 0, 1]  # system, user, asst, tool, asst


def test_render_equals_template_on_saved_tokenizer(chat_tokenizer, chat_tokenizer_dir, tmp_path):
    ids, _ = render(CONV, chat_tokenizer)
    assert ids == chat_tokenizer.encode(render_text(CONV, chat_tokenizer), add_special_tokens=False)
    chat_tokenizer.save_pretrained(tmp_path)  # what a checkpoint carries
    again = AutoTokenizer.from_pretrained(tmp_path)
    out = again.apply_chat_template(CONV["messages"], tools=TOOLS, tokenize=True, return_dict=True)
    assert list(out["input_ids"]) == ids


def test_reasoning_off_drops_think_and_marks_system(chat_tokenizer):
    ids, mask = render(CONV, chat_tokenizer, reasoning=False)
    think = chat_tokenizer.convert_tokens_to_ids("<think>")
    assert think not in ids
    text = render_text(CONV, chat_tokenizer, reasoning=False)
    assert f"</tools>\n\n{REASONING_OFF_MARKER}<|im_end|>" in text
    assert spans(ids, mask, chat_tokenizer)[3] == (1, "It is 5.<|im_end|>")  # the answer alone is trained


def test_reasoning_off_without_system_creates_one(chat_tokenizer):
    conv = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}]}
    assert render_text(conv, chat_tokenizer, reasoning=False) == (
        f"<|im_start|>system\n{REASONING_OFF_MARKER}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n")
    assert render_text(conv, chat_tokenizer).count("<|im_start|>system") == 0


def test_generation_prompt(chat_tokenizer):
    conv = {"messages": CONV["messages"][:2]}
    assert render_text(conv, chat_tokenizer, add_generation_prompt=True).endswith(
        "What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")


def test_reasoning_fraction_is_seeded_per_id():
    convs = [{"id": f"c{i}", "messages": []} for i in range(4000)]
    off = [not reasoning_enabled(c, 0.25, seed=3) for c in convs]
    assert abs(sum(off) / len(off) - 0.25) < 0.03
    assert off == [not reasoning_enabled(c, 0.25, seed=3) for c in convs]
    assert off != [not reasoning_enabled(c, 0.25, seed=4) for c in convs]
    assert all(reasoning_enabled(c, 0.0, 0) for c in convs[:50])


def test_render_needs_the_template(chat_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
    tok.chat_template = None
    with pytest.raises(ValueError, match="install_chat_template"):
        render(CONV, tok)
    assert render(CONV, install_chat_template(tok))[0]


def test_a_template_without_generation_blocks_or_an_end_token_is_refused(chat_tokenizer_dir):
    # without {% generation %} blocks the spans are derived (tests/data/test_chat_masks.py); this template
    # ends a turn with no token the model could stop at, so nothing can be masked exactly: a data error
    tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(BadInput, match=r"conversation 'c1': assistant turn 0 \(message 2\) cannot be masked exactly: "
                                       "the turn ends in no special token"):
        render(CONV, tok)
