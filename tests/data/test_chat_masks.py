"""Assistant masks from templates without {% generation %} blocks: three published-checkpoint shapes
(tests/data/templates/, written for these tests), the supervised text of every example written out
by hand, the not-prefix-stable split, tool-call arguments in the form each template reads, and the
refusals (exit 2, naming the conversation)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from stagewise.data.chat import render, render_examples, render_text
from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import KwargSwitch, NoSwitch, SystemFlagSwitch, resolve_switch
from stagewise.data.tool_arguments import arguments_form

TEMPLATES = Path(__file__).parent / "templates"
HEADER_TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
FLAG = SystemFlagSwitch(when_off="/no_think", when_on="/think")

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate", "parameters": {"type": "object"}}}]
TOOLS_JSON = '{"type": "function", "function": {"name": "calc", "description": "evaluate", "parameters": {"type": "object"}}}'


def call(expression: str) -> dict:
    return {"type": "function", "function": {"name": "calc", "arguments": '{"expression": "' + expression + '"}'}}


# A tool call with a trace, the tool's reply, an answer with a trace; then a second question.
THREE_TURNS = {"id": "three-turns", "tools": TOOLS, "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [call("2 + 3")]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5.", "reasoning_content": "The tool said 5."},
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "8.", "reasoning_content": "Easy."},
]}
# Two calls in one turn, two tool replies in a row, an answer with a trace.
PARALLEL = {"id": "parallel", "tools": TOOLS, "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Add 2 + 3 and 4 + 4."},
    {"role": "assistant", "content": "", "reasoning_content": "Two sums.", "tool_calls": [call("2 + 3"), call("4 + 4")]},
    {"role": "tool", "content": "5"},
    {"role": "tool", "content": "8"},
    {"role": "assistant", "content": "5 and 8.", "reasoning_content": "Both came back."},
]}
# Llama 3.1's shape: one call per turn, no traces.
LLAMA = {"id": "llama", "tools": TOOLS, "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [call("2 + 3")]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "You are welcome."},
]}


@pytest.fixture(scope="module")
def tokenizer_dir(chat_tokenizer_dir, tmp_path_factory):
    """The session's chat tokenizer plus the Llama-3 header tokens, saved once."""
    tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
    tok.add_tokens(HEADER_TOKENS, special_tokens=True)
    out = tmp_path_factory.mktemp("template_shapes")
    tok.save_pretrained(out)
    return out


@pytest.fixture
def with_template(tokenizer_dir):
    """A fresh tokenizer carrying the named test template (or a template's text)."""
    def make(template: str):
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        path = TEMPLATES / template
        tok.chat_template = path.read_text() if template.endswith(".jinja") else template
        return tok
    return make


def supervised(tok, example) -> list[str]:
    """The text of each run of supervised tokens of one (ids, mask) example."""
    ids, mask = example
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append(tok.decode(ids[start:i]))
            start = None
    return runs


def text_of(tok, example) -> str:
    return tok.decode(example[0])


# --------------------------------------------------------------------------- ChatML, enable_thinking, truncation

def test_think_kwarg_template_is_recognised(with_template):
    tok = with_template("chatml_think_kwarg.jinja")
    assert resolve_switch(tok) == KwargSwitch(name="enable_thinking", when_on=True, when_off=False)
    assert arguments_form(tok) == "either"  # a string is written as is, a mapping with tojson


def test_truncating_template_splits_at_the_rewritten_turns(with_template):
    tok = with_template("chatml_think_kwarg.jinja")
    first, second = render_examples(THREE_TURNS, tok)
    # the first two turns in the context they were written in (their traces kept), the third in the whole
    # conversation (where the template has dropped the first two turns' traces)
    assert supervised(tok, first) == [
        '<think>\nUse the tool.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}'
        '\n</tool_call><|im_end|>',
        "<think>\nThe tool said 5.\n</think>\n\nIt is 5.<|im_end|>"]
    assert supervised(tok, second) == ["<think>\nEasy.\n</think>\n\n8.<|im_end|>"]
    assert text_of(tok, first) == (
        f"<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n{TOOLS_JSON}\n</tools><|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        '<|im_start|>assistant\n<think>\nUse the tool.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": '
        '{"expression": "2 + 3"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n5<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nThe tool said 5.\n</think>\n\nIt is 5.<|im_end|>\n")
    assert text_of(tok, second) == (
        f"<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n{TOOLS_JSON}\n</tools><|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\nIt is 5.<|im_end|>\n"
        "<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n<think>\nEasy.\n</think>\n\n8.<|im_end|>\n")
    with pytest.raises(BadInput, match=r"conversation 'three-turns': .*not prefix-stable.*2 examples"):
        render(THREE_TURNS, tok)  # what needs one sequence cannot have it


def test_truncating_template_reasoning_off_is_its_own_off_form(with_template):
    tok = with_template("chatml_think_kwarg.jinja")
    first, second = render_examples(THREE_TURNS, tok, reasoning=False)
    assert supervised(tok, first) == [
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>',
        "It is 5.<|im_end|>"]
    assert supervised(tok, second) == ["8.<|im_end|>"]
    # enable_thinking=false: the generation prompt holds an empty trace, which is context, never trained
    assert text_of(tok, second).endswith(
        "<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n8.<|im_end|>\n")
    assert not any(t in text_of(tok, e) for e in (first, second) for t in ("Use the tool.", "The tool said", "Easy."))


def test_a_prefix_stable_conversation_is_one_example(with_template):
    tok = with_template("chatml_think_kwarg.jinja")
    conv = {"id": "one", "messages": THREE_TURNS["messages"][:5]}  # no second question: nothing is rewritten
    (example,) = render_examples(conv, tok)
    assert supervised(tok, example) == [
        '<think>\nUse the tool.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}'
        '\n</tool_call><|im_end|>',
        "<think>\nThe tool said 5.\n</think>\n\nIt is 5.<|im_end|>"]
    assert render(conv, tok) == example
    assert example[0] == tok(render_text(conv, tok), add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------- ChatML, system-prompt flag, merged tools

def test_system_flag_template_has_no_switch_it_reads(with_template):
    tok = with_template("chatml_system_flag.jinja")
    assert resolve_switch(tok) == NoSwitch()
    assert resolve_switch(tok, FLAG) == FLAG
    assert arguments_form(tok) == "string"  # it writes arguments as given


def test_system_flag_on_with_parallel_calls_and_merged_tool_replies(with_template):
    tok = with_template("chatml_system_flag.jinja")
    (example,) = render_examples(PARALLEL, tok, switch=FLAG)
    assert supervised(tok, example) == [
        '<think>\nTwo sums.\n</think>\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "calc", "arguments": {"expression": "4 + 4"}}\n</tool_call><|im_end|>',
        "<think>\nBoth came back.\n</think>\n5 and 8.<|im_end|>"]
    assert text_of(tok, example) == (
        f"<|im_start|>system\nBe brief.\n\n/think\n\n<tools>\n{TOOLS_JSON}\n</tools><|im_end|>\n"
        "<|im_start|>user\nAdd 2 + 3 and 4 + 4.<|im_end|>\n"
        '<|im_start|>assistant\n<think>\nTwo sums.\n</think>\n<tool_call>\n{"name": "calc", "arguments": '
        '{"expression": "2 + 3"}}\n</tool_call>\n<tool_call>\n{"name": "calc", "arguments": {"expression": "4 + 4"}}'
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n8\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nBoth came back.\n</think>\n5 and 8.<|im_end|>\n")


def test_system_flag_off_writes_the_flag_and_drops_the_traces(with_template):
    tok = with_template("chatml_system_flag.jinja")
    (example,) = render_examples(PARALLEL, tok, reasoning=False, switch=FLAG)
    assert supervised(tok, example) == [
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "2 + 3"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "calc", "arguments": {"expression": "4 + 4"}}\n</tool_call><|im_end|>',
        "5 and 8.<|im_end|>"]
    assert text_of(tok, example).startswith("<|im_start|>system\nBe brief.\n\n/no_think\n\n<tools>\n")
    bare = {"id": "bare", "messages": [{"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Hello", "reasoning_content": "greet"}]}
    assert render_text(bare, tok, reasoning=False, switch=FLAG) == (
        "<|im_start|>system\n/no_think<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n")


def test_mapping_arguments_are_written_as_json_for_a_string_template(with_template):
    tok = with_template("chatml_system_flag.jinja")
    as_mapping = {**PARALLEL, "messages": [
        {**m, "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expression": e}}}
                             for e in ("2 + 3", "4 + 4")]} if m.get("tool_calls") else m
        for m in PARALLEL["messages"]]}
    assert render_examples(as_mapping, tok, switch=FLAG) == render_examples(PARALLEL, tok, switch=FLAG)
    assert "{'expression'" not in render_text(as_mapping, tok, switch=FLAG)


# --------------------------------------------------------------------------- Llama 3 headers, mapping arguments

def test_llama3_template_reads_arguments_as_a_mapping(with_template):
    tok = with_template("llama3_tools.jinja")
    assert resolve_switch(tok) == NoSwitch()
    assert arguments_form(tok) == "mapping"
    (example,) = render_examples(LLAMA, tok)
    assert supervised(tok, example) == ['{"name": "calc", "parameters": {"expression": "2 + 3"}}<|eot_id|>',
                                        "It is 5.<|eot_id|>", "You are welcome.<|eot_id|>"]
    assert text_of(tok, example) == (
        "<|bos|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        f"Today Date: 26 Jul 2024\n\nTools:\n{TOOLS_JSON}\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "calc", "parameters": {"expression": "2 + 3"}}'
        "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nIt is 5.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nThanks.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nYou are welcome.<|eot_id|>")


def test_arguments_that_are_not_json_are_refused_for_a_mapping_template(with_template):
    tok = with_template("llama3_tools.jinja")
    bad = {**LLAMA, "id": "bad-args", "messages": [
        *LLAMA["messages"][:2], {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": "2 + 3"}}]}]}
    with pytest.raises(BadInput, match=r"conversation 'bad-args': message 2, tool call 0: arguments are not JSON"):
        render_examples(bad, tok)
    not_object = {**bad, "messages": [*bad["messages"][:2], {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "calc", "arguments": "[1, 2]"}}]}]}
    with pytest.raises(BadInput, match=r"conversation 'bad-args': message 2, tool call 0: arguments are JSON but not "
                                       r"an object \(list\)"):
        render_examples(not_object, tok)


def test_a_template_error_names_the_conversation(with_template):
    tok = with_template("llama3_tools.jinja")
    two_calls = {**PARALLEL, "messages": [{k: v for k, v in m.items() if k != "reasoning_content"}
                                          for m in PARALLEL["messages"]]}
    with pytest.raises(BadInput, match=r"conversation 'parallel': the chat template cannot render it: .*"
                                       r"only supports single tool-calls"):
        render_examples(two_calls, tok)


def test_a_trace_the_template_does_not_write_is_refused(with_template):
    tok = with_template("llama3_tools.jinja")
    with pytest.raises(BadInput, match=r"conversation 'three-turns': assistant turn 0 \(message 2\) cannot be masked "
                                       r"exactly: the template does not write the turn's reasoning_content"):
        render_examples(THREE_TURNS, tok)
    assert len(render_examples(THREE_TURNS, tok, reasoning=False)) == 1  # off: the traces are dropped first


# --------------------------------------------------------------------------- what cannot be masked exactly

CHATML_TURNS = ('{%- for m in messages -%}{{- "<|im_start|>" ~ m.role ~ "\\n" ~ OPEN(m) ~ (m.content or "") '
                '~ "<|im_end|>\\n" -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- GEN -}}{%- endif -%}')
SHORT = {"id": "short", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "What now"}]}


def chatml(open_assistant: str, generation_prompt: str) -> str:
    """A ChatML template whose assistant turns start with `open_assistant` and whose generation prompt is given."""
    opening = f'("{open_assistant}" if m.role == "assistant" else "")'
    return CHATML_TURNS.replace("OPEN(m)", opening).replace("GEN", f'"{generation_prompt}"')


def test_a_span_off_token_boundaries_is_refused(with_template):
    tok = with_template(chatml("W", "<|im_start|>assistant\\nW"))  # the prompt ends inside the word "What"
    assert len(tok.tokenize("What")) == 1  # one token here: the turn would start inside it
    with pytest.raises(BadInput, match=r"conversation 'short': assistant turn 0 \(message 1\) cannot be masked "
                                       r"exactly: characters \d+\.\.\d+ do not fall on token boundaries"):
        render_examples({**SHORT, "messages": [SHORT["messages"][0], {"role": "assistant", "content": "hat now"}]}, tok)


def test_a_template_writing_something_else_is_refused(with_template):
    upper = ('{%- for m in messages -%}{{- "<|im_start|>" ~ m.role ~ "\\n" ~ (m.content | upper) ~ "<|im_end|>\\n" -}}'
             '{%- endfor -%}{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\\n" -}}{%- endif -%}')
    with pytest.raises(BadInput, match=r"conversation 'short': assistant turn 0 \(message 1\) cannot be masked "
                                       r"exactly: the template does not write the turn's content: it writes "
                                       r"'WHAT NOW<\|im_end\|>'"):
        render_examples(SHORT, with_template(upper))


def test_a_generation_prompt_that_does_not_open_the_turn_is_refused(with_template):
    tok = with_template(chatml("", "<|im_start|>model\\n"))
    with pytest.raises(BadInput, match=r"conversation 'short': assistant turn 0 \(message 1\) cannot be masked "
                                       r"exactly: the template's generation prompt is not how it opens the turn"):
        render_examples(SHORT, tok)


def test_a_turn_without_an_end_token_is_refused(with_template):
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(BadInput, match=r"conversation 'short': assistant turn 0 \(message 1\) cannot be masked "
                                       r"exactly: the turn ends in no special token"):
        render_examples(SHORT, with_template(plain))


@pytest.mark.parametrize("template, end", [("chatml_think_kwarg.jinja", "<|im_end|>"),
                                           ("chatml_system_flag.jinja", "<|im_end|>"),
                                           ("llama3_tools.jinja", "<|eot_id|>")])
def test_the_turn_end_token_is_the_templates_own_and_generation_stops_there(with_template, tmp_path, template, end):
    import json

    from stagewise.data.chat import turn_end_token
    from stagewise.data.sft_assembly import set_chat_eos
    from stagewise.eval.heldout import end_ids

    tok = with_template(template)
    assert turn_end_token(tok) == end
    assert end_ids(tok)[0] == tok.convert_tokens_to_ids(end)
    tok.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 0}')
    set_chat_eos(tmp_path)
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == [
        0, tok.convert_tokens_to_ids(end)]


def test_a_tokenizer_without_a_template_has_no_turn_end(tokenizer_dir):
    from stagewise.data.chat import turn_end_token

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = None
    assert turn_end_token(tok) is None
