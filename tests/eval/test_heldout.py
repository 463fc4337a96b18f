"""Held-out conversations: which ones are answered, that exact match compares the right thing, the loss."""

from __future__ import annotations

import math

import pytest
import torch

from stagewise.eval.heldout import _generate, answer_items, heldout_answers, heldout_loss, shape


def conv(domain: str, user: str, answer: str, **extra) -> dict:
    return {"domain": domain, "messages": [{"role": "user", "content": user},
                                           {"role": "assistant", "content": answer}], **extra}


CONVS = [
    conv("arithmetic", "Compute 2 + 3.", "2 + 3 = 5"),
    conv("arithmetic", "Compute 4 + 4.", "4 + 4 = 8"),
    conv("arithmetic", "Compute 1 + 1.", "1 + 1 = 2"),
    conv("sorting", "Sort 3, 1, 2 in ascending order", "1, 2, 3"),
    {"domain": "calculator", "tools": [{"type": "function", "function": {"name": "calculator"}}],
     "messages": [{"role": "user", "content": "Use the calculator"}, {"role": "assistant", "content": "ok"}]},
    conv("lookup", "Records: a: 1. What is a?", "  "),  # an empty answer cannot be matched
]


def test_answer_items_skip_tools_and_empty_answers_and_spread_a_limit():
    items = answer_items(CONVS)
    assert [(t, d) for _, t, d in items] == [("2 + 3 = 5", "arithmetic"), ("4 + 4 = 8", "arithmetic"),
                                             ("1 + 1 = 2", "arithmetic"), ("1, 2, 3", "sorting")]
    assert items[0][0] == [{"role": "user", "content": "Compute 2 + 3."}]
    assert [d for _, _, d in answer_items(CONVS, limit=2)] == ["arithmetic", "sorting"]  # round robin over domains
    assert [d for _, _, d in answer_items(CONVS, max_prompt_chars=14)] == ["arithmetic"] * 3  # the sorting prompt is longer
    multi = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
    assert answer_items([multi]) == []  # only a system/user prefix before the one answer


def test_shape_keeps_the_form_not_the_content():
    assert shape("quartz 396") == shape("amber 4") == "a 9"
    assert shape("710, 369, 144") == "9, 9, 9" != shape("710, 369")
    assert shape('{"answer": -76}') == '{"a": -9}' and shape("GREY") == "A" and shape("Grey") == "Aa"
    assert shape("") == ""


@pytest.fixture(scope="module")
def chat_lm(tiny_lm):
    from stagewise.data.chat import install_chat_template

    model, tokenizer = tiny_lm
    return model, install_chat_template(tokenizer)


def test_exact_match_compares_the_stripped_answer(chat_lm, monkeypatch):
    model, tokenizer = chat_lm
    replies = iter([["2 + 3 = 5", "4 + 4 = 9", "1 + 1 = 2"], ["1, 2"]])
    seen = []

    def fake_generate(model, tokenizer, prompts, max_new_tokens, device):
        seen.append(max_new_tokens)
        return next(replies)

    monkeypatch.setattr("stagewise.eval.heldout._generate", fake_generate)
    got = heldout_answers(model, tokenizer, CONVS, batch_size=3)
    assert got["answered"] == 4 and got["exact_match"] == 0.5 and got["format_match"] == 0.75
    assert got["exact_match_arithmetic"] == pytest.approx(2 / 3) and got["exact_match_sorting"] == 0.0
    assert got["format_match_arithmetic"] == 1.0 and got["format_match_sorting"] == 0.0
    assert all(0 < n <= 48 for n in seen)


def test_generation_runs_on_left_padded_batches(chat_lm):
    model, tokenizer = chat_lm
    short = tokenizer("Compute 1 + 1.", add_special_tokens=False).input_ids
    long = tokenizer("Compute 12345 + 67890 and then some more words.", add_special_tokens=False).input_ids
    torch.manual_seed(0)
    batched = _generate(model, tokenizer, [short, long], 4, "cpu")
    alone = _generate(model, tokenizer, [short], 4, "cpu")
    assert len(batched) == 2 and all(isinstance(t, str) for t in batched)
    assert batched[0] == alone[0]  # padding on the left does not change a greedy answer


def test_heldout_loss_is_finite_and_counts_assistant_tokens(chat_lm):
    model, tokenizer = chat_lm
    got = heldout_loss(model, tokenizer, CONVS[:4], pack_size=128)
    assert math.isfinite(got["loss"]) and got["loss"] > 0 and got["supervised_tokens"] > 0
    assert heldout_loss(model, tokenizer, CONVS[:4], pack_size=128, limit=2)["supervised_tokens"] < got["supervised_tokens"]


def test_round_robin_takes_items_in_turn_from_each_domain():
    from types import SimpleNamespace as Row

    from stagewise.eval.heldout import round_robin

    rows = [Row(domain=d, n=i) for d, i in [("b", 0), ("b", 1), ("b", 2), ("a", 0)]]
    assert [(r.domain, r.n) for r in round_robin(rows, lambda r: r.domain, 3)] == [("a", 0), ("b", 0), ("b", 1)]
    assert round_robin(rows, lambda r: r.domain, None) == rows


def test_no_answerable_conversation_has_no_rates_and_no_intervals():
    """A held-out set of tool conversations only (a team's, Llama 3.1's shape): nothing to answer, so
    no rate and no bound rather than an interval of no items."""
    from stagewise.eval.heldout import answer_intervals, answer_metrics

    assert answer_metrics({}) == {} and answer_intervals({}) == {}
