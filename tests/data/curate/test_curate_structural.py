"""Structural checks, one hand-made case per reason, and well-formed conversations passing."""

from __future__ import annotations

import pytest

from stagewise.data.curate.structural import Rejected, check_structure, parse_line

U = {"role": "user", "content": "What is 2 + 2?"}
A = {"role": "assistant", "content": "4"}
S = {"role": "system", "content": "Be brief."}
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def call(name="calculator", arguments='{"expression": "2 + 2"}'):
    fn = {"name": name, "arguments": arguments}
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": fn}]}


T = {"role": "tool", "content": "4"}


def reason(conv) -> str:
    with pytest.raises(Rejected) as e:
        check_structure(conv)
    return e.value.reason


@pytest.mark.parametrize("conv", [
    {"messages": [U, A]},
    {"messages": [S, U, A, U, A]},
    {"tools": TOOLS, "messages": [U, call(), T, A]},
    {"tools": TOOLS, "messages": [U, call(arguments={"expression": "1"}), T, A]},
    {"messages": [U, {"role": "assistant", "content": "4", "reasoning_content": "2 and 2 make 4."}]},
])
def test_well_formed_passes(conv):
    check_structure(conv)


@pytest.mark.parametrize("line", ['{"messages": [', "not json", "[1, 2]", '"a string"', b"\xff\xfe{}"])
def test_malformed_json(line):
    with pytest.raises(Rejected) as e:
        parse_line(line)
    assert e.value.reason == "malformed_json"


def test_parse_line_accepts_bytes_and_str():
    assert parse_line(b'{"a": 1}\n') == parse_line('{"a": 1}') == {"a": 1}


@pytest.mark.parametrize("conv", [
    {}, {"messages": []}, {"messages": "hi"}, {"messages": ["hi"]}, {"messages": [{"content": "x"}]},
    {"messages": [{"role": "user", "content": ["parts"]}, A]},
    {"messages": [{"role": "user"}, A]},
    {"tools": [{"type": "function", "function": {}}], "messages": [U, A]},
])
def test_bad_schema(conv):
    assert reason(conv) == "bad_schema"


def test_unknown_role():
    assert reason({"messages": [U, {"role": "narrator", "content": "x"}, A]}) == "unknown_role"


@pytest.mark.parametrize("messages", [
    [U, U, A],                 # two user turns in a row
    [A, U, A],                 # assistant first
    [S, A],                    # assistant right after system
    [U, A, A],                 # two assistant turns in a row
    [U, S, A],                 # system not first
    [U, T, A],                 # tool without a pending tool call
    [U, A, U],                 # ends with a user turn
])
def test_role_order(messages):
    assert reason({"messages": messages}) == "role_order"


def test_role_order_with_tools():
    assert reason({"tools": TOOLS, "messages": [U, call(), A]}) == "role_order"       # call never answered
    assert reason({"tools": TOOLS, "messages": [U, call(), T, T, A]}) == "role_order"  # two results for one call
    assert reason({"tools": TOOLS, "messages": [U, call()]}) == "role_order"          # ends on a pending call


def test_tool_calls():
    assert reason({"messages": [U, call(), T, A]}) == "tool_call_without_tools"
    assert reason({"tools": TOOLS, "messages": [U, call("weather"), T, A]}) == "undefined_tool"
    assert reason({"tools": TOOLS, "messages": [U, call(arguments="{not json"), T, A]}) == "bad_tool_arguments"
    assert reason({"tools": TOOLS, "messages": [U, call(arguments="[1]"), T, A]}) == "bad_tool_arguments"


@pytest.mark.parametrize("assistant", [
    {"role": "assistant", "content": ""},
    {"role": "assistant", "content": "   \n"},
    {"role": "assistant", "content": None},
    {"role": "assistant", "content": "", "reasoning_content": "thinking but no answer"},
])
def test_empty_assistant(assistant):
    assert reason({"messages": [U, assistant]}) == "empty_assistant"
