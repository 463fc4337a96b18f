"""data/sft_assembly.py without Prefect: keep_previous, the realised mixture, chat eos, curation
of several sources, the chat-model start checkpoint, and blend-and-pack on disk."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagewise.data.curate import CurationError
from stagewise.data.sft_assembly import (
    IM_END,
    SFTDataError,
    blend_and_pack,
    chat_eos,
    check_enough_packs,
    curate_sources,
    failed_rejects,
    keep_previous,
    make_chat_start,
    read_sample,
    realised_mixture,
    tokenizer_files,
    write_jsonl,
)
from stagewise.data.sft_config import CurateConfig, SFTBlend, SFTDataSource
from stagewise.data.world.conversations import domain_conversations

# --------------------------------------------------------------------------- pure helpers

def test_keep_previous_takes_a_seeded_share_without_repeats():
    prev = [("a" if i % 2 else "b", {"id": i}) for i in range(40)]
    kept = keep_previous(prev, 0.3, seed=1)
    assert len(kept) == 12 and len({c["id"] for _, c in kept}) == 12
    assert kept == keep_previous(prev, 0.3, seed=1) != keep_previous(prev, 0.3, seed=2)
    assert [c["id"] for _, c in kept] == sorted(c["id"] for _, c in kept)  # previous order kept
    assert keep_previous(prev, 0.0, seed=1) == [] and len(keep_previous(prev, 1.0, seed=1)) == 40


def test_realised_mixture_counts_domains_and_the_carried_share():
    mix = realised_mixture(["a", "a", "b", "a"], kept_previous=1)
    assert mix == {"a": 0.75, "b": 0.25, "kept_previous": 0.25}
    assert realised_mixture([], 0) == {"kept_previous": 0.0}


def test_chat_eos_adds_im_end_once():
    assert chat_eos({"eos_token_id": 2, "pad_token_id": 0}, 4) == {"eos_token_id": [2, 4], "pad_token_id": 0}
    assert chat_eos({"eos_token_id": [2, 4]}, 4)["eos_token_id"] == [2, 4]
    assert chat_eos({}, 4)["eos_token_id"] == [4]


def test_check_enough_packs_names_the_shortfall():
    check_enough_packs({"packs": 4}, seq_length=512, global_batch=4)
    with pytest.raises(SFTDataError, match="3 packs of 512 tokens, fewer than one global batch \\(4\\)"):
        check_enough_packs({"packs": 3}, seq_length=512, global_batch=4)


# --------------------------------------------------------------------------- on disk

@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two clean demo-world sources and one with a malformed line in four."""
    root = tmp_path_factory.mktemp("sources")
    write_jsonl(root / "arith.jsonl", domain_conversations("arithmetic", 40, 0))
    write_jsonl(root / "sort.jsonl", domain_conversations("sorting", 40, 0))
    good = [json.dumps(c) for c in domain_conversations("lookup", 30, 0, 100)]
    (root / "dirty.jsonl").write_text("".join(line + "\n" + ("{not json\n" if i % 3 == 0 else "")
                                              for i, line in enumerate(good)))
    return root


def test_curate_sources_writes_kept_reports_and_summary(sources, tmp_path):
    srcs = [SFTDataSource(name="arith", path="arith.jsonl", domain="arithmetic"),
            SFTDataSource(name="dirty", path="dirty.jsonl", domain="lookup", max_reject_rate=0.5)]
    paths = {s.name: sources / s.path for s in srcs}
    out, final = tmp_path / "tmp", tmp_path / "curated"
    out.mkdir()
    summary = curate_sources(paths, srcs, CurateConfig(), out, final=final)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["dirty"]["rejected"]["malformed_json"] == 10 and summary["dirty"]["kept"] <= 30
    assert len((out / "arith.jsonl").read_text().splitlines()) == summary["arith"]["kept"] > 30
    assert summary["dirty"]["rejects_path"] == str(final / "dirty.rejects.jsonl")  # where it will live
    assert json.loads((out / "dirty.report.json").read_text()) == summary["dirty"]


def test_curate_sources_keeps_the_failed_sources_rejects(sources, tmp_path):
    srcs = [SFTDataSource(name="dirty", path="dirty.jsonl", max_reject_rate=0.05)]
    out, final = tmp_path / "tmp", tmp_path / "curated"
    out.mkdir()
    with pytest.raises(CurationError, match="source 'dirty': .* above max_reject_rate 5.0%") as info:
        curate_sources({"dirty": sources / "dirty.jsonl"}, srcs, CurateConfig(), out, final=final)
    kept = failed_rejects(final, "dirty")
    assert str(info.value).endswith(f"rejects in {kept}") and kept.parent.name == "curated.failed"
    assert "malformed_json 10" in str(info.value) and len(kept.read_text().splitlines()) >= 10


TOOL = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}


def _call(name, arguments):
    return {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                                 "function": {"name": name, "arguments": arguments}}]}


def test_curate_sources_reads_a_teams_parquet_folder_and_datasets_directory(tmp_path):
    """No conversion step: a Hub folder of prompt/completion parquet and a save_to_disk directory
    of messages (reasoning, tool calls with string and mapping arguments) curate as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    datasets = pytest.importorskip("datasets")
    hub = tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    pairs = [{"prompt": "Name the capital of Norway.", "completion": "Oslo."},
             {"prompt": "Spell the word cat backwards.", "completion": "tac"}]
    pq.write_table(pa.Table.from_pylist(pairs), hub / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "held out", "completion": "x"}]), hub / "test-00000-of-00001.parquet")
    user = {"role": "user", "content": "Compute 3 * 5 with the calculator."}
    convs = [
        {"messages": [{"role": "user", "content": "Is 7 prime?"},
                      {"role": "assistant", "content": "Yes.", "reasoning_content": "7 has no divisors but 1 and 7."}]},
        {"tools": json.dumps([TOOL]), "messages": [user, _call("calculator", json.dumps({"expression": "3 * 5"})),
                                                   {"role": "tool", "content": "15"},
                                                   {"role": "assistant", "content": "3 * 5 = 15."}]},
        {"tools": json.dumps([TOOL]), "messages": [user, _call("weather", json.dumps({"city": "Oslo"})),
                                                   {"role": "tool", "content": "sunny"},
                                                   {"role": "assistant", "content": "It is sunny."}]},
    ]
    columns = {"tools": [c.get("tools") for c in convs], "messages": [c["messages"] for c in convs]}
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "saved"))  # from_list keeps the first row's keys only
    srcs = [SFTDataSource(name="pairs", path="hub"), SFTDataSource(name="tools", path="saved", max_reject_rate=0.5)]
    out = tmp_path / "out"
    out.mkdir()
    summary = curate_sources({s.name: tmp_path / s.path for s in srcs}, srcs, CurateConfig(), out)
    assert [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()] == [
        {"messages": [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": p["completion"]}]}
        for p in pairs]
    assert [json.loads(line) for line in (out / "tools.jsonl").read_text().splitlines()] == [
        convs[0], {**convs[1], "tools": [TOOL]}]
    assert summary["tools"]["rejected"] == {"undefined_tool": 1}
    reject = json.loads((out / "tools.rejects.jsonl").read_text())
    assert (reject["reason"], reject["line"], reject["where"]) == (
        "undefined_tool", 3, f"{tmp_path}/saved/data-00000-of-00001.arrow:row 2")


def test_curate_sources_stops_on_a_row_that_is_no_conversation(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stagewise.data.errors import BadInput

    f = tmp_path / "team.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
                                         {"messages": [{"content": "hi"}]}]), f)
    src = SFTDataSource(name="team", path=str(f))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BadInput) as e:
        curate_sources({"team": f}, [src], CurateConfig(), out)
    assert str(e.value) == f"{f}:row 1: messages.0.role: missing (keys: ['content'])"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, chat_tokenizer_dir):
    """A tiny checkpoint whose tokenizer has the chat tokens but no template installed yet."""
    from transformers import AutoTokenizer

    from stagewise.model.build import build_model
    from stagewise.model.checkpoint import CheckpointMeta, save_checkpoint
    from stagewise.model.config import ModelConfig

    tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
    tok.chat_template = None
    tok_dir = tmp_path_factory.mktemp("plain_tok")
    tok.save_pretrained(tok_dir)
    (tok_dir / "chat_template.jinja").unlink(missing_ok=True)
    model = build_model(ModelConfig(preset="tiny", overrides={"hidden_size": 64, "intermediate_size": 128}),
                        vocab_size=600, seed=0)
    return save_checkpoint(tmp_path_factory.mktemp("pre") / "step-00000005", model, tok_dir,
                           CheckpointMeta("pretrain", 5, 1280, "h", None))


def test_make_chat_start_installs_template_and_eos_and_leaves_the_source(checkpoint, tmp_path):
    from transformers import AutoTokenizer

    from stagewise.model.checkpoint import weights_sha256

    assert not AutoTokenizer.from_pretrained(checkpoint).chat_template
    before = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    make_chat_start(checkpoint, tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    eos = json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"]
    assert eos.count(tok.convert_tokens_to_ids(IM_END)) == 1
    assert weights_sha256(tmp_path) == weights_sha256(checkpoint)
    assert {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()} == before
    with pytest.raises(FileNotFoundError, match="no config.json"):
        make_chat_start(tmp_path / "nowhere", tmp_path / "x")


def test_make_chat_start_keeps_a_checkpoints_own_template(checkpoint, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    own = tmp_path / "own"
    shutil.copytree(checkpoint, own)
    tok = AutoTokenizer.from_pretrained(own)
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    tok.save_pretrained(own)
    tokenizer_bytes = {p.name: p.read_bytes() for p in tokenizer_files(own)}
    assert "chat_template.jinja" in tokenizer_bytes
    (tmp_path / "start").mkdir()  # the step's directory (data.atomic.building makes it)
    make_chat_start(own, tmp_path / "start")
    assert {p.name: p.read_bytes() for p in tokenizer_files(tmp_path / "start")} == tokenizer_bytes  # byte for byte


def test_blend_and_pack_with_a_previous_sample(sources, chat_tokenizer_dir, tmp_path):
    from stagewise.data.sft_packs import load_packed

    files = {"arith": str(sources / "arith.jsonl"), "sort": str(sources / "sort.jsonl")}
    domains = {"arith": "arithmetic", "sort": "sorting"}
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one_dir.mkdir()
    two_dir.mkdir()
    one = blend_and_pack(files, domains, SFTBlend(weights={"arithmetic": 1, "sorting": 1}, conversations=40,
                                                  reasoning_off_fraction=0.5), 512, 3, chat_tokenizer_dir, one_dir)
    assert one == json.loads((one_dir / "report.json").read_text())
    assert one["mixture"] == {"arithmetic": 0.5, "kept_previous": 0.0, "sorting": 0.5}
    assert one["packing"]["conversations"] == 40 and one["packing"]["reasoning_off"] > 0
    assert load_packed(one_dir / "rows.npz")["input_ids"].shape == (one["packing"]["packs"], 512)
    assert [d for d, _ in read_sample(one_dir / "sample.jsonl")].count("sorting") == 20
    two = blend_and_pack(files, domains, SFTBlend(weights={"sorting": 1}, conversations=10), 512, 4,
                         chat_tokenizer_dir, two_dir, previous_sample=one_dir / "sample.jsonl", keep_share=0.25)
    assert two["kept_previous"] == 10 and two["mixture"]["kept_previous"] == 0.5
    assert two["packing"]["conversations"] == 20
    again = tmp_path / "again"
    again.mkdir()
    blend_and_pack(files, domains, SFTBlend(weights={"sorting": 1}, conversations=10), 512, 4,
                   chat_tokenizer_dir, again, previous_sample=one_dir / "sample.jsonl", keep_share=0.25)
    assert all(np.array_equal(a, b) for a, b in zip(load_packed(again / "rows.npz").values(),
                                                    load_packed(two_dir / "rows.npz").values()))


def test_tokenizer_files_are_the_ones_that_decide_tokenization(chat_tokenizer_dir):
    names = {p.name for p in tokenizer_files(chat_tokenizer_dir)}
    assert "tokenizer.json" in names and all(n.startswith(("tokenizer", "chat_template", "special_tokens"))
                                             for n in names)
