"""The local benchmark items: reproducible, committed up to date, and well-formed."""

from __future__ import annotations

import json
import re

import pytest

from stagewise.eval.benchmarks import TASKS_DIR
from stagewise.eval.benchmarks.build_tasks import TASKS, build, render

GENERATE = ["world_arithmetic", "world_sorting", "world_lookup", "world_chat_format"]
CHOICE = ["world_arithmetic_mc", "world_compare_mc"]


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS_DIR / "data" / f"{name}.jsonl").read_text().splitlines()]


def test_committed_files_match_the_generator():
    assert build(check=True) == [], "run `python -m stagewise.eval.benchmarks.build_tasks` and commit eval/benchmarks/data/"


def test_generation_is_deterministic(tmp_path):
    assert render("world_lookup") == render("world_lookup")
    assert build(tmp_path) == list(TASKS) and build(tmp_path) == []


def test_every_task_has_a_yaml_and_a_sensible_size():
    assert set(TASKS) == set(GENERATE + CHOICE)
    for name in TASKS:
        assert (TASKS_DIR / f"{name}.yaml").is_file()
        assert 50 <= len(rows(name)) <= 200


@pytest.mark.parametrize("name", GENERATE)
def test_generate_items_have_a_one_line_target(name):
    for row in rows(name):
        assert row["target"] and "\n" not in row["target"] and row["target"] == row["target"].strip()


def test_arithmetic_targets_are_the_answers():
    for row in rows("world_arithmetic"):
        a, op, b = re.match(r"Compute (-?\d+) ([+x-]) (-?\d+)\.", row["prompt"]).groups()
        assert int(row["target"]) == {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]


def test_sorting_targets_are_sorted():
    for row in rows("world_sorting"):
        items = row["target"].split(", ")
        assert items == (sorted(items, key=int) if row["kind"] == "numbers" else sorted(items))


def test_lookup_targets_are_in_the_records():
    for row in rows("world_lookup"):
        key = re.search(r"value of (\S+)\?", row["prompt"]).group(1)
        assert f"\n{key}: {row['target']}\n" in row["prompt"]


def test_chat_items_use_the_chat_markers_and_a_format():
    for row in rows("world_chat_format"):
        assert row["prompt"].startswith("<|im_start|>system\n") and row["prompt"].endswith("<|im_start|>assistant\n")
        if row["kind"] == "json":
            assert set(json.loads(row["target"])) == {"answer"}
        else:
            assert row["target"] == row["target"].upper()


@pytest.mark.parametrize("name", CHOICE)
def test_choice_items_have_one_right_unique_answer(name):
    for row in rows(name):
        assert len(set(row["choices"])) == len(row["choices"]) >= 2
        assert 0 <= row["label"] < len(row["choices"])


def test_choice_labels_point_at_the_right_answer():
    for row in rows("world_arithmetic_mc"):
        a, op, b = re.match(r"Compute (-?\d+) ([+x-]) (-?\d+)\.", row["prompt"]).groups()
        assert int(row["choices"][row["label"]]) == {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
    for row in rows("world_compare_mc"):
        pick = max if row["kind"] == "larger" else min
        assert row["choices"][row["label"]] == str(pick(int(c) for c in row["choices"]))


def test_chat_prompts_are_what_the_sft_chat_template_writes():
    chat_module = pytest.importorskip("stagewise.data.chat")
    from stagewise.data.tokenizer import train_bpe
    from stagewise.eval.benchmarks.build_tasks import chat

    tok = chat_module.install_chat_template(train_bpe(["a few words"], 300))
    user = "Write the word cedar in uppercase letters."
    conv = {"messages": [{"role": "user", "content": user}]}
    assert chat_module.render_text(conv, tok, reasoning=False, add_generation_prompt=True) == chat(user)
