"""SFT masks through the chat templates published checkpoints ship, byte for byte (tests/data/templates/published/,
see its README): Nemotron 3 Nano's, Qwen3's and Llama 3.1's, beside the demo's own, on multi-turn tool conversations.

The supervised text of every example is written out by hand from reading each template. What these
templates do that the hand-made look-alikes (tests/data/templates/*.jinja) did not:

- Nemotron 3 Nano writes an assistant turn without a trace as `<think></think>answer` while its generation
  prompt opens one (`<think>\\n`): such a turn trains after the template's own reasoning-off prompt
  (`enable_thinking=false`: `<think></think>`), what the model is prompted with when run reasoning-off;
- it writes tool-call arguments as `<parameter=NAME>` blocks read from a mapping, and the tool's reply as a
  user turn;
- Llama 3.1's writes no trace at all: training traces through it is refused, naming
  `stages.sft.data.reasoning_content: drop`, under which the answers train alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from stagewise.data.chat import chat_template, render_examples, render_text, turn_end_token
from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import KwargSwitch, NoSwitch, SystemFlagSwitch, resolve_switch
from stagewise.data.sft_packs import load_packed
from stagewise.data.sft_rows import without_reasoning
from stagewise.data.tool_arguments import arguments_form
from stagewise.data.world.conversations import DOMAINS, domain_conversations
from tests.data.test_chat_masks import supervised

PUBLISHED = Path(__file__).parent / "templates" / "published"
SHA256 = {  # of the files as TRL keeps them (trl/chat_templates/, huggingface/trl f2cd577): a changed byte fails here
    "nemotron_3_nano.jinja": "ab7813c3abdd9cb655905a410728b26c7884eca45ddfab8d9f931553485a7862",
    "qwen3.jinja": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
    "llama3_1.jinja": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
}
LLAMA_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
"""Llama 3.1's own special tokens, added to the session's chat tokenizer for its template."""

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate",
                                           "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                          "required": ["expression"]}}}]


def call(expression: str) -> dict:
    return {"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expression": expression})}}


# The demo's calculator shape: a call with a trace, the tool's reply, the answer without a trace.
TOOL_TURN = {"id": "tool-turn", "tools": TOOLS, "messages": [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [call("2 + 3")]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
]}
# Then a second question: the first answer's context is rewritten (traces before the last user turn dropped).
TWO_QUESTIONS = {"id": "two-questions", "tools": TOOLS, "messages": [
    *TOOL_TURN["messages"],
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "8.", "reasoning_content": "Easy."},
]}

NEMOTRON_CALL = ("<tool_call>\n<function=calc>\n<parameter=expression>\n2 + 3\n</parameter>\n</function>\n"
                 "</tool_call>\n<|im_end|>")
QWEN_CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>'
OURS_CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def tokenizer_dir(chat_tokenizer_dir, tmp_path_factory):
    """The session's chat tokenizer plus Llama 3.1's special tokens, saved once."""
    tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
    tok.add_tokens(LLAMA_TOKENS, special_tokens=True)
    out = tmp_path_factory.mktemp("published_templates")
    tok.save_pretrained(out)
    return out


@pytest.fixture
def with_template(tokenizer_dir):
    def make(name: str):
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        tok.chat_template = chat_template() if name == "ours" else (PUBLISHED / name).read_text()
        return tok
    return make


def before_run(example, n: int) -> list[int]:
    """The token ids before the n-th run of supervised tokens."""
    ids, mask = example
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    return ids[:starts[n]]


def test_the_templates_are_the_published_bytes():
    for name, digest in SHA256.items():
        assert hashlib.sha256((PUBLISHED / name).read_bytes()).hexdigest() == digest, name


# --------------------------------------------------------------------------- Nemotron 3 Nano

def test_nemotron_reads_enable_thinking_and_arguments_as_a_mapping(with_template):
    tok = with_template("nemotron_3_nano.jinja")
    assert resolve_switch(tok) == KwargSwitch(name="enable_thinking")
    assert arguments_form(tok) == "mapping"
    assert turn_end_token(tok) == "<|im_end|>"


def test_nemotron_a_turn_without_a_trace_trains_after_its_reasoning_off_prompt(with_template):
    tok = with_template("nemotron_3_nano.jinja")
    (example,) = render_examples(TOOL_TURN, tok)
    # the call after the opened trace; the answer (written `<think></think>It is 5.`) after the off prompt
    assert supervised(tok, example) == ["Use the tool.\n</think>\n" + NEMOTRON_CALL, "It is 5.<|im_end|>"]
    assert tok.decode(example[0]) == render_text(TOOL_TURN, tok)  # one sequence: the whole conversation
    messages = [{**m, "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expression": "2 + 3"}}}]}
                if m.get("tool_calls") else m for m in TOOL_TURN["messages"]]  # the template reads a mapping
    first = tok.apply_chat_template(messages[:1], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    off = tok.apply_chat_template(messages[:3], tools=TOOLS, add_generation_prompt=True, tokenize=False,
                                  enable_thinking=False)
    assert first.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<|im_end|>\n"
                        "<|im_start|>assistant\n<think></think>")
    # what the model is trained to write follows exactly the tokens it is prompted with
    assert before_run(example, 0) == tok(first, add_special_tokens=False)["input_ids"]
    assert before_run(example, 1) == tok(off, add_special_tokens=False)["input_ids"]


def test_nemotron_a_second_question_splits_where_the_template_drops_the_traces(with_template):
    tok = with_template("nemotron_3_nano.jinja")
    first, second = render_examples(TWO_QUESTIONS, tok)
    assert supervised(tok, first) == ["Use the tool.\n</think>\n" + NEMOTRON_CALL, "It is 5.<|im_end|>"]
    assert supervised(tok, second) == ["Easy.\n</think>\n8.<|im_end|>"]
    # in the second, the earlier turns as the template rewrites them once a user turn follows
    assert ("<|im_start|>assistant\n<think></think>\n" + NEMOTRON_CALL + "\n<|im_start|>user\n<tool_response>\n5\n"
            "</tool_response>\n<|im_end|>\n<|im_start|>assistant\n<think></think>It is 5.<|im_end|>\n") in tok.decode(second[0])


def test_nemotron_reasoning_off_trains_every_turn_after_the_off_prompt(with_template):
    tok = with_template("nemotron_3_nano.jinja")
    (example,) = render_examples(TWO_QUESTIONS, tok, reasoning=False)  # no traces: nothing rewritten
    assert supervised(tok, example) == ["\n" + NEMOTRON_CALL, "It is 5.<|im_end|>", "8.<|im_end|>"]
    assert "Use the tool." not in tok.decode(example[0]) and "Easy." not in tok.decode(example[0])


def test_nemotron_under_a_system_flag_has_no_off_prompt_and_is_refused(with_template):
    """Named as a system-prompt flag, the switch is no template variable: no reasoning-off prompt to
    take the untraced turn after, so it cannot be masked exactly (message 4: the flag's system turn is first)."""
    tok = with_template("nemotron_3_nano.jinja")
    flag = SystemFlagSwitch(when_off="/no_think", when_on="/think")
    with pytest.raises(BadInput, match=r"conversation 'tool-turn': assistant turn 1 \(message 4\) cannot be masked "
                                       r"exactly: the template's generation prompt is not how it opens the turn"):
        render_examples(TOOL_TURN, tok, switch=flag)


# --------------------------------------------------------------------------- Qwen3 and ours

def test_qwen3_on_a_multi_turn_tool_conversation(with_template):
    tok = with_template("qwen3.jinja")
    assert resolve_switch(tok) == KwargSwitch(name="enable_thinking") and arguments_form(tok) == "either"
    first, second = render_examples(TWO_QUESTIONS, tok)
    # its generation prompt opens no trace: the turn writes its own (an empty one when it has none, last)
    assert supervised(tok, first) == ["<think>\nUse the tool.\n</think>\n\n" + QWEN_CALL,
                                      "<think>\n\n</think>\n\nIt is 5.<|im_end|>"]
    assert supervised(tok, second) == ["<think>\nEasy.\n</think>\n\n8.<|im_end|>"]
    # off, the last turn of a context is written after an empty trace, which is gone once anything follows:
    # each turn trains in its own context, after the off prompt's empty trace
    off = render_examples(TWO_QUESTIONS, tok, reasoning=False)
    assert [supervised(tok, e) for e in off] == [[QWEN_CALL], ["It is 5.<|im_end|>"], ["8.<|im_end|>"]]
    assert all(tok.decode(e[0]).endswith(f"<|im_start|>assistant\n<think>\n\n</think>\n\n{s}\n")
               for e, s in zip(off, [QWEN_CALL, "It is 5.<|im_end|>", "8.<|im_end|>"]))


def test_ours_on_a_multi_turn_tool_conversation(with_template):
    tok = with_template("ours")
    (example,) = render_examples(TWO_QUESTIONS, tok)  # {% generation %} blocks: one example, never rewritten
    assert supervised(tok, example) == ["<think>\nUse the tool.\n</think>\n" + OURS_CALL, "It is 5.<|im_end|>",
                                        "<think>\nEasy.\n</think>\n8.<|im_end|>"]


@pytest.mark.parametrize("name", ["nemotron_3_nano.jinja", "qwen3.jinja", "ours"])
def test_every_demo_conversation_trains_through_the_template(with_template, name):
    """The demo world's SFT domains (tool calls and their replies included), reasoning on and off:
    every conversation masks, and every assistant turn's answer and tool name is in a supervised run
    that ends at the template's turn end."""
    tok = with_template(name)
    for domain in DOMAINS:
        if domain == "long_context":
            continue
        for conv in domain_conversations(domain, 12, 5, 200):
            for reasoning in (True, False):
                runs = [r for e in render_examples(conv, tok, reasoning=reasoning) for r in supervised(tok, e)]
                assert all(r.endswith("<|im_end|>") for r in runs), (conv["id"], runs)
                for m in conv["messages"]:
                    if m["role"] != "assistant":
                        continue
                    wanted = [m["content"]] if m.get("content") else []
                    wanted += [c["function"]["name"] for c in m.get("tool_calls") or []]
                    assert all(any(w in r for r in runs) for w in wanted), (conv["id"], reasoning, wanted, runs)


# --------------------------------------------------------------------------- Llama 3.1: no place for reasoning

LLAMA_CONV = {"id": "llama-traces", "tools": TOOLS, "messages": [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": None, "reasoning_content": "Use the tool.", "tool_calls": [call("2 + 3")]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5.", "reasoning_content": "The tool said 5."},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "You are welcome.", "reasoning_content": "Be polite."},
]}
LLAMA_SPANS = ['{"name": "calc", "parameters": {"expression": "2 + 3"}}<|eot_id|>', "It is 5.<|eot_id|>",
               "You are welcome.<|eot_id|>"]


def test_llama31_refuses_traces_naming_drop(with_template):
    tok = with_template("llama3_1.jinja")
    assert resolve_switch(tok) == NoSwitch() and arguments_form(tok) == "mapping"
    with pytest.raises(BadInput, match=r"conversation 'llama-traces': assistant turn 0 \(message 1\) cannot be masked "
                                       r"exactly: the template does not write the turn's reasoning_content: .*set "
                                       r"stages\.sft\.data\.reasoning_content: drop"):
        render_examples(LLAMA_CONV, tok)


def test_llama31_under_drop_supervises_the_answers_alone(with_template):
    tok = with_template("llama3_1.jinja")
    dropped = without_reasoning(LLAMA_CONV)
    assert LLAMA_CONV["messages"][1]["reasoning_content"] == "Use the tool."  # the given one is not modified
    (example,) = render_examples(dropped, tok)
    assert supervised(tok, example) == LLAMA_SPANS
    text = tok.decode(example[0])
    assert text.startswith("<|bos|><|start_header_id|>system<|end_header_id|>\n\n")
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>' in text  # the reply as JSON
    assert not any(t in text for t in ("Use the tool.", "The tool said 5.", "Be polite."))
    assert without_reasoning(dropped) is dropped  # nothing left to drop: the same object


def test_data_pack_drops_the_traces_when_asked(with_template, tmp_path):
    from stagewise.cli import app

    tok = with_template("llama3_1.jinja")
    tok.save_pretrained(tmp_path / "tok")
    source = tmp_path / "convs.jsonl"
    source.write_text(json.dumps(LLAMA_CONV) + "\n")
    args = ["data", "pack", str(source), "--tokenizer", str(tmp_path / "tok"), "--pack-size", "1024", "--json"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "reasoning_content: drop" in refused.output, refused.output
    packed = CliRunner().invoke(app, [*args, "--reasoning-content", "drop", "--out", str(tmp_path / "rows.npz")])
    assert packed.exit_code == 0, packed.output
    spans_tokens = sum(len(tok(s, add_special_tokens=False)["input_ids"]) for s in LLAMA_SPANS)
    assert json.loads(packed.stdout)["supervised_tokens"] == spans_tokens
    rows = load_packed(tmp_path / "rows.npz")
    labels = [int(t) for t in rows["labels"][0] if t != -100]
    assert tok.decode(labels) == "".join(LLAMA_SPANS)
