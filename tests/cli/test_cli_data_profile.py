"""`stagewise data profile`: a SOURCE file or a whole recipe, --json, the files written, exit 2 on bad input."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from typer.testing import CliRunner

from stagewise.cli import app

runner = CliRunner()

CALC = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def conversation(i: int) -> dict:
    """A calculator conversation: 4 messages, 2 assistant turns, 1 tool call, a reasoning trace."""
    return {"tools": [CALC], "messages": [
        {"role": "user", "content": f"What is {i} * 17? Use the calculator."},
        {"role": "assistant", "content": "", "reasoning_content": "exact with the tool",
         "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                          "arguments": json.dumps({"expression": f"{i} * 17"})}}]},
        {"role": "tool", "content": str(i * 17)},
        {"role": "assistant", "content": f"{i} * 17 = {i * 17}"}]}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A small BPE without a chat template (the command adds it in memory)."""
    from stagewise.data.tokenizer import train_bpe

    texts = [json.dumps(conversation(i)) for i in range(50)] + [f"plain text number {i}" for i in range(50)]
    out = tmp_path_factory.mktemp("tok")
    train_bpe(texts, 400).save_pretrained(out)
    return out


def test_help_has_an_example_and_says_where_files_go():
    result = run("data", "profile", "--help")
    assert result.exit_code == 0 and re.search(r"Example:\n\s+stagewise data profile ", result.output)
    assert "SOURCE|RECIPE" in result.output
    assert "data_profile" in result.output and "profile" in run("data", "--help").output


def test_conversation_source_json_and_default_output(tmp_path, monkeypatch, tokenizer_dir):
    source = tmp_path / "calc.jsonl"
    source.write_text("".join(json.dumps(conversation(i)) + "\n" for i in range(6)) + "{oops\n")
    monkeypatch.chdir(tmp_path)
    result = run("data", "profile", source, "--tokenizer", tokenizer_dir, "--seq-length", 4096, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (src,) = report["sft_sources"]
    assert src["conversations"] == 6 and src["curation"]["rejected"] == {"malformed_json": 1}
    assert (src["messages"]["mean"], src["assistant_turns"]["mean"]) == (4.0, 2.0)
    assert src["tools"]["per_tool"] == {"calculator": 6} and src["reasoning_tokens"]["count"] == 6
    assert [w["code"] for w in report["warnings"]] == ["tool_share", "reject_rate"]
    assert report["outputs"] == {"json": str(tmp_path / "calc.profile.json"),  # next to the name, in the cwd
                                 "png": str(tmp_path / "calc.profile.png")}
    assert json.loads((tmp_path / "calc.profile.json").read_text())["sft_sources"][0]["conversations"] == 6
    assert (tmp_path / "calc.profile.png").read_bytes()[:4] == b"\x89PNG"


def test_text_source_text_output_and_out_dir(tmp_path, tokenizer_dir):
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": f"plain text number {i} " * (1 + i)}) + "\n" for i in range(5)))
    result = run("data", "profile", source, "--tokenizer", tokenizer_dir, "--out", tmp_path / "o", "--seq-length", 8)
    assert result.exit_code == 0, result.output
    assert "docs" in result.output and "text" in result.output and "p99" in result.output
    assert "docs: p99 length" in result.output and "seq_length's 8" in result.output
    report = json.loads((tmp_path / "o" / "docs.profile.json").read_text())
    assert report["text_sources"][0]["documents"] == 5 and (tmp_path / "o" / "docs.profile.png").is_file()


def test_bad_input_exits_2_with_the_place(tmp_path, tokenizer_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": 3}\n')
    result = run("data", "profile", bad, "--tokenizer", tokenizer_dir, "--json")
    assert result.exit_code == 2 and f"{bad}:2" in json.loads(result.stdout)["error"]
    no_tok = run("data", "profile", bad)
    assert no_tok.exit_code == 2 and "--tokenizer" in no_tok.output
    assert run("data", "profile", tmp_path / "missing.jsonl", "--tokenizer", tokenizer_dir).exit_code == 2
    assert run("data", "profile", bad, "--tokenizer", tmp_path, "--json").exit_code == 2  # not a tokenizer
    assert run("data", "profile", bad, "--tokenizer", tokenizer_dir, "--set", "seed=1").exit_code == 2


RECIPE = """\
name: p
seed: 3
tokenizer: {vocab_size: 300}
data:
  world: {facts: 20, arithmetic: 20, stdlib_files: 0, retrieval: 0, noisy: 0}
  sources:
    - {name: facts, path: "@world/facts.jsonl"}
    - {name: arithmetic, path: "@world/arithmetic.jsonl"}
stages:
  pretrain:
    tokens: 8192
    seq_length: 64
    global_batch: 4
    micro_batch: 4
    phases: [{name: all, blend: {facts: 1, arithmetic: 1}}]
  sft:
    data:
      world: {per_domain: 15, long_context: 1, entities: 20}
      sources:
        - {name: calculator, path: "@world/sft_calculator.jsonl"}
        - {name: sorting, path: "@world/sft_sorting.jsonl"}
        - {name: dirty, path: "@world/sft_dirty.jsonl", domain: sorting, max_reject_rate: 0.5}
    stages:
      - name: one
        tokens: 4096
        seq_length: 256
        global_batch: 2
        micro_batch: 1
        blend: {weights: {calculator: 1, sorting: 1}}
"""


def test_recipe_needs_its_prepared_tokenizer_then_profiles_every_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "p.yaml"
    recipe.write_text(textwrap.dedent(RECIPE))
    first = run("data", "profile", recipe, "--json")
    assert first.exit_code == 2 and f"stagewise data prepare {recipe}" in json.loads(first.stdout)["error"]
    assert run("data", "prepare", recipe).exit_code == 0
    result = run("data", "profile", recipe, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [s["name"] for s in report["text_sources"]] == ["facts", "arithmetic"]
    assert report["text_sources"][0]["documents"] == 20 and report["text_sources"][0]["limits"] == {"pretrain": 64}
    sft = {s["name"]: s for s in report["sft_sources"]}
    assert set(sft) == {"calculator", "sorting", "dirty"} and sft["dirty"]["domains"] == {"sorting": sft["dirty"]["conversations"]}
    assert sft["dirty"]["curation"]["rejected"]["malformed_json"] == 2 and sft["calculator"]["limits"] == {"one": 256}
    assert {d["domain"] for d in report["domains"]} == {"calculator", "sorting"}
    assert report["tokenizer"].endswith("tokenizer") and "/data/" in report["tokenizer"]
    assert (tmp_path / "runs" / "p" / "data_profile" / "profile.json").is_file()
    assert any((tmp_path / "runs" / "p" / "sft_data").glob("curated-*/summary.json"))  # what the SFT stage reuses
