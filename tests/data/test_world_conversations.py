"""Demo-world SFT conversations: deterministic, well-formed, verifiably right, held-out split, dirty slice."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from stagewise.data.chat import prompt_key, render
from stagewise.data.curate import curate
from stagewise.data.curate.structural import check_structure
from stagewise.data.sft_config import CurateConfig
from stagewise.data.world.calculator import evaluate
from stagewise.data.world.conversations import DOMAINS, domain_conversations, generate_sft_world


@pytest.mark.parametrize("domain", DOMAINS)
def test_domains_are_deterministic_and_well_formed(domain, chat_tokenizer):
    n = 5 if domain == "long_context" else 20
    convs = domain_conversations(domain, n, seed=3, n_entities=100)
    assert convs == domain_conversations(domain, n, seed=3, n_entities=100)
    assert convs != domain_conversations(domain, n, seed=4, n_entities=100)
    for c in convs:
        check_structure(c)
        assert c["domain"] == domain and c["id"].startswith(domain)
    ids, mask = render(convs[0], chat_tokenizer)
    assert sum(mask) > 0


def test_answers_are_right():
    for c in domain_conversations("calculator", 30, 0):
        call = json.loads(c["messages"][1]["tool_calls"][0]["function"]["arguments"])
        result = c["messages"][2]["content"]
        assert result == evaluate(call["expression"]) == str(eval(call["expression"]))  # noqa: S307 - test oracle
        assert c["messages"][3]["content"].endswith(f"= {result}")
    small = 0
    for c in domain_conversations("arithmetic", 60, 0):
        expr = re.search(r"-?\d+ [-+x] \d+", c["messages"][0]["content"]).group(0)
        assert int(c["messages"][1]["content"]) == eval(expr.replace("x", "*"))  # noqa: S307 - test oracle
        assert c["messages"][1]["reasoning_content"]
        width = max(len(x) for x in re.findall(r"\d+", expr))
        assert width <= 2, expr  # mental arithmetic; multi-digit problems belong to the calculator
        small += width == 1
    assert 0.6 < small / 60 < 0.95  # 80% one-digit operands
    kinds = set()
    for c in domain_conversations("format", 60, 0, n_entities=50):
        user, answer = c["messages"][-2]["content"], c["messages"][-1]["content"]
        if "JSON of the form" in user:
            expr = re.search(r"Compute (.+)\. Reply", user).group(1)
            assert json.loads(answer) == {"answer": eval(expr.replace("x", "*"))}  # noqa: S307 - test oracle
            kinds.add("json")
        elif "in uppercase" in user and "region" not in user and "colour" not in user and "emblem" not in user:
            assert answer == answer.upper() and answer.lower() in user
            kinds.add("upper")
        else:
            kinds.add("fact")
    assert kinds == {"json", "upper", "fact"}
    for c in domain_conversations("sorting", 30, 0):
        nums = [int(x) for x in c["messages"][0]["content"].split(": ")[1].split(", ")]
        got = [int(x) for x in c["messages"][1]["content"].split(", ")]
        assert got == sorted(nums, reverse="descending" in c["messages"][0]["content"])
    for c in domain_conversations("lookup", 30, 0):
        key = c["messages"][0]["content"].rsplit("value of ", 1)[1].rstrip("?")
        assert f"\n{key}: {c['messages'][1]['content']}\n" in c["messages"][0]["content"]


def test_prompts_are_distinct_within_a_domain():
    """Curation would drop repeated prompts as duplicates (and fail a clean source), so the
    generator draws again instead, while the domain has new prompts to give."""
    for domain in ("arithmetic", "format", "sorting"):
        keys = [prompt_key(c) for c in domain_conversations(domain, 300, 0, n_entities=50)]
        assert len(set(keys)) == len(keys), domain


def test_calculator_is_safe():
    assert evaluate("(2 + 3) * 4") == "20" and evaluate("7 / 2") == "3.5" and evaluate("-3 ** 2") == "-9"
    assert evaluate("1 / 0") == "error: division by zero"
    for bad in ("__import__('os')", "a + 1", "2 ** 100", "[1, 2]"):
        assert evaluate(bad).startswith("error:")


def test_generate_sft_world(tmp_path):
    paths = generate_sft_world(tmp_path, seed=0, per_domain=60, long_context=5, eval_fraction=0.2, n_entities=200)
    assert set(paths) == {*DOMAINS, "eval", "dirty"}
    train_keys = {prompt_key(json.loads(line)) for d in DOMAINS for line in paths[d].read_text().splitlines()}
    held = [json.loads(line) for line in paths["eval"].read_text().splitlines()]
    assert 20 < len(held) < 110 and not train_keys & {prompt_key(c) for c in held}
    report = curate(paths["dirty"], CurateConfig())
    assert report.rejected == {"malformed_json": 2, "unknown_role": 1, "tool_call_without_tools": 1,
                               "undefined_tool": 1, "empty_assistant": 1, "role_order": 3,
                               "repetition_window": 1, "exact_duplicate": 3, "near_duplicate": 3}
    assert Counter(c["domain"] for c in report.kept) == {"lookup": 40, "arithmetic": 40}
