"""Verifiers: right, wrong and malformed completions for every environment, and the registry."""

from __future__ import annotations

import pytest

from stagewise.data.errors import BadInput
from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments import ENVIRONMENTS, Environment, get_environment


def row(expected, **extra) -> RLRow:
    return RLRow.model_validate({"responses_create_params": {"input": "q"}, "expected_answer": expected, **extra})


def judge(env: str, completion: str, expected) -> tuple[float | None, bool]:
    e, r = get_environment(env), row(expected)
    return e.verify(completion, r), e.well_formed(completion, r)


def test_registry_and_unknown_names():
    assert set(ENVIRONMENTS) == {"exact_answer", "json_answer", "uppercase", "calculator", "sorting"}
    assert all(isinstance(e, Environment) and e.name == n and e.about for n, e in ENVIRONMENTS.items())
    with pytest.raises(BadInput, match="unknown 'maths'; known: calculator, exact_answer, json_answer"):
        get_environment("maths")


@pytest.mark.parametrize(("completion", "expected", "verdict", "formed"), [
    ("12", 12, 1.0, True),
    ("12.0", "12", 1.0, True),
    (" 12 \n", 12, 1.0, True),
    ("+12", 12.0, 1.0, True),
    ("1,200", 1200, 1.0, True),
    ("-7", -7, 1.0, True),
    ("<think>\n3 * 4 = 12.\n</think>\n12<|im_end|>", 12, 1.0, True),  # reasoning and end marker tolerated
    ("Paris", "paris", 1.0, True),
    ("  new   York. ", "New York", 1.0, True),
    ("13", 12, 0.0, True),
    ("-12", 12, 0.0, True),
    ("12.5", 12, 0.0, True),
    ("The answer is 12", 12, 0.0, False),  # only the answer counts
    ("twelve", 12, 0.0, False),
    ("", 12, 0.0, False),
    ("12\n13", 12, 0.0, False),
    ("Lyon", "Paris", 0.0, True),
    ("12", None, None, True),  # nothing to judge against
])
def test_exact_answer(completion, expected, verdict, formed):
    assert judge("exact_answer", completion, expected) == (verdict, formed)


@pytest.mark.parametrize(("completion", "expected", "verdict", "formed"), [
    ('{"answer": 42}', 42, 1.0, True),
    ('{"answer":42.0}', 42, 1.0, True),
    ('  {"answer": "42"} ', 42, 1.0, True),
    ('{"answer": -3}', -3, 1.0, True),
    ('{"answer": 41}', 42, 0.0, True),
    ('{"answer": true}', 1, 0.0, True),
    ('{"answer": null}', 42, 0.0, True),
    ('{"answer": 42, "note": "x"}', 42, 0.0, False),
    ('{"result": 42}', 42, 0.0, False),
    ("42", 42, 0.0, False),
    ('{"answer": 42', 42, 0.0, False),
    ('[{"answer": 42}]', 42, 0.0, False),
    ("", 42, 0.0, False),
    ('{"answer": 42}', None, None, True),
])
def test_json_answer(completion, expected, verdict, formed):
    assert judge("json_answer", completion, expected) == (verdict, formed)


@pytest.mark.parametrize(("completion", "expected", "verdict", "formed"), [
    ("AMBER FOX", "amber fox", 1.0, True),
    ("AMBER FOX", "AMBER FOX", 1.0, True),
    ("  AMBER \n FOX ", "amber  fox", 1.0, True),
    ("amber fox", "amber fox", 0.0, False),  # case is the task
    ("Amber Fox", "amber fox", 0.0, False),
    ("AMBER", "amber fox", 0.0, True),
    ("FOX AMBER", "amber fox", 0.0, True),
    ("", "amber fox", 0.0, False),
    ("123", "amber fox", 0.0, False),
    ("AMBER", None, None, True),
])
def test_uppercase(completion, expected, verdict, formed):
    assert judge("uppercase", completion, expected) == (verdict, formed)


@pytest.mark.parametrize(("completion", "expected", "verdict", "formed"), [
    ("1, 2, 3", [1, 2, 3], 1.0, True),
    ("1,2,3", [1, 2, 3], 1.0, True),
    (" 9 , 5.0 ,1 ", [9, 5, 1], 1.0, True),
    ("1, 2, 3", "1, 2, 3", 1.0, True),
    ("b, a", ["B", "A"], 1.0, True),
    ("3, 2, 1", [1, 2, 3], 0.0, True),
    ("1, 2", [1, 2, 3], 0.0, True),
    ("1, 2, 3, 3", [1, 2, 3], 0.0, True),
    ("1 2 3", [1, 2, 3], 0.0, True),  # one item "1 2 3"
    ("1, , 3", [1, 2, 3], 0.0, False),
    ("1, 2,", [1, 2], 0.0, False),
    ("", [1, 2], 0.0, False),
    ("1,\n2", [1, 2], 1.0, False),  # right items, but not on one line
    ("1, 2", None, None, True),
])
def test_sorting(completion, expected, verdict, formed):
    assert judge("sorting", completion, expected) == (verdict, formed)


def call(arguments: str, name: str = "calculator") -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.mark.parametrize(("completion", "expected", "verdict", "formed"), [
    (call('{"expression": "(12 + 7) * 3"}'), 57, 1.0, True),
    (call('{"expression": "57"}'), "57", 1.0, True),
    (call('"{\\"expression\\": \\"100 / 8\\"}"'), 12.5, 1.0, True),  # arguments as a JSON string
    ("<think>\nuse the tool\n</think>\n" + call('{"expression": "2 * 3"}') + "<|im_end|>", 6, 1.0, True),
    ("Let me compute.\n" + call('{"expression": "2 * 3"}'), 6, 1.0, True),
    (call('{"expression": "2 * 4"}'), 6, 0.0, True),
    (call('{"expression": "1 / 0"}'), 6, 0.0, True),
    (call('{"expression": "__import__(\'os\')"}'), 6, 0.0, True),  # never eval()'d
    (call('{"expression": "((9 ** 12) ** 12) ** 12"}'), 6, 0.0, True),  # too many powers: not evaluated
    (call('{"expression": "2 * 3"}', name="weather"), 6, 0.0, False),
    (call('{"expr": "2 * 3"}'), 6, 0.0, False),
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * 3"}\n</tool_call>', 6, 0.0, False),
    ('<tool_call>["calculator"]</tool_call>', 6, 0.0, False),
    ('{"name": "calculator", "arguments": {"expression": "2 * 3"}}', 6, 0.0, False),  # no tool_call markers
    ("6", 6, 0.0, False),
    (call('{"expression": "2 * 3"}') + "\n" + call('{"expression": "1"}'), 6, 1.0, False),  # first call counts
    (call('{"expression": "2 * 3"}'), "six", None, True),
])
def test_calculator(completion, expected, verdict, formed):
    assert judge("calculator", completion, expected) == (verdict, formed)


def test_calculator_reads_the_call_chat_template_renders(chat_template_call):
    assert judge("calculator", chat_template_call, 57) == (1.0, True)


@pytest.fixture
def chat_template_call() -> str:
    """An assistant tool-call turn rendered by data/templates/chat.jinja (the SFT format), cut
    to the assistant's generation."""
    import jinja2

    from stagewise.data.chat import chat_template

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = lambda msg: (_ for _ in ()).throw(ValueError(msg))
    text = chat_template().replace("{%- generation -%}", "").replace("{%- endgeneration -%}", "")
    rendered = env.from_string(text).render(messages=[
        {"role": "user", "content": "What is (12 + 7) * 3?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "(12 + 7) * 3"}'}}]}])
    return rendered.split("<|im_start|>assistant\n", 1)[1]
