"""Fuzzing the files a user hands over: sources, conversations, checkpoints, gate rules.

Each kind of file is corrupted the ways real files break: truncated, random bytes spliced in,
re-encoded (Latin-1, UTF-16), or valid JSON/YAML of the wrong shape (a value of another
type, a list for an object). Checkpoint directories and rule files go through the CLI
(`stagewise inspect CKPT`, `merge`, `data pack --tokenizer`, `cutoffs --rule`, `data curate`)
and must exit 0 or 2 with a message; pretraining sources are read by the library (the CLI
reads them only inside `data prepare`, which trains a tokenizer) and may raise only the
project's BadInput. Seeds are fixed (derandomize).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from stagewise.data.config import SourceConfig
from stagewise.data.errors import BadInput
from stagewise.data.sources import iter_texts

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate, Phase.shrink])
HOW = st.sampled_from(["truncate", "bytes", "latin1", "utf16", "shape"])
ODD = [None, "x", 7, -1, 0, 2.5, True, [], [1, "a"], {}, {"k": [1]}]


def corrupt(data: bytes, how: str, at: float, noise: bytes, seed: int) -> bytes:
    """One corruption of a file's bytes; `shape` keeps JSON/YAML valid but swaps a value's type."""
    cut = int(len(data) * at)
    if how == "truncate":
        return data[:cut]
    if how == "bytes":
        return data[:cut] + noise + data[cut + len(noise):]
    if how == "latin1":
        return data.decode("utf-8", "replace").replace('"', '"é', 1).encode("latin-1", "replace")
    if how == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    return reshape(data, seed)


def _swap(node: Any, rng: random.Random) -> Any:
    if isinstance(node, dict) and node:
        key = rng.choice(sorted(node, key=str))
        node[key] = _swap(node[key], rng) if rng.random() < 0.5 else rng.choice(ODD)
        return node
    if isinstance(node, list) and node:
        i = rng.randrange(len(node))
        node[i] = _swap(node[i], rng) if rng.random() < 0.5 else rng.choice(ODD)
        return node
    return rng.choice(ODD)


def reshape(data: bytes, seed: int) -> bytes:
    """Valid JSON lines / JSON / YAML with one value of the wrong type (or the wrong top-level shape)."""
    rng = random.Random(seed)
    text = data.decode("utf-8")
    try:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        if len(lines) > 1:  # jsonl: reshape one line
            i = rng.randrange(len(lines))
            lines[i] = _swap(lines[i], rng)
            return "\n".join(json.dumps(x) for x in lines).encode()
        doc = lines[0]
        return json.dumps(_swap(doc, rng) if rng.random() < 0.9 else [doc]).encode()
    except ValueError:
        doc = yaml.safe_load(text)
        return yaml.safe_dump(_swap(doc, rng) if rng.random() < 0.9 else [doc]).encode()


# --------------------------------------------------------------------------- pretraining sources

DOCS = [f"document {i}: some text, with ünïcode and numbers {i * 7}" for i in range(40)]


def _source_bytes(fmt: str, tmp: Path) -> bytes:
    if fmt == "jsonl":
        return "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)).encode()
    if fmt == "txt":
        return "\n\n".join(DOCS).encode()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": DOCS}), tmp / "seed.parquet")
    return (tmp / "seed.parquet").read_bytes()


def test_corrupted_pretraining_sources_raise_only_bad_input(tmp_path, cli):
    _, _, cases = cli
    seeds = {fmt: _source_bytes(fmt, tmp_path) for fmt in ("jsonl", "txt", "parquet")}

    @example("jsonl", "bytes", 0.5, b"\xff\xfe", 0, "error")
    @example("parquet", "bytes", 0.25, b"\x80", 0, "error")  # a corrupt page: UnicodeDecodeError in pyarrow
    @example("jsonl", "shape", 0.0, b"x", 3, "skip")
    @settings(max_examples=200, **SETTINGS)
    @given(st.sampled_from(sorted(seeds)), HOW, st.floats(0, 1), st.binary(min_size=1, max_size=16),
           st.integers(0, 10**6), st.sampled_from(["error", "skip"]))
    def case(fmt, how, at, noise, seed, on_bad):
        how = "bytes" if how == "shape" and fmt != "jsonl" else how  # only jsonl has a JSON shape
        f = tmp_path / f"src.{fmt}"
        f.write_bytes(corrupt(seeds[fmt], how, at, noise, seed))
        cases["pretraining sources"] += 1
        counts: dict[str, int] = {}
        src = SourceConfig(name="s", path=str(f), on_bad_line=on_bad)
        try:
            texts = list(iter_texts(src, tmp_path, bad_lines=counts))
        except BadInput as e:
            assert str(f) in str(e) and on_bad == "error" or fmt == "parquet", e
            return
        assert all(isinstance(t, str) and t.strip() for t in texts)

    case()
    assert cases["pretraining sources"] >= 200


# --------------------------------------------------------------------------- conversations

CONVS = [{"messages": [{"role": "user", "content": f"what is {i} + {i}?"},
                       {"role": "assistant", "content": str(2 * i)}]} for i in range(30)]
CONV_BYTES = "".join(json.dumps(c) + "\n" for c in CONVS).encode()


def test_corrupted_conversations_through_data_curate(tmp_path, cli):
    run, check, cases = cli

    @settings(max_examples=100, **SETTINGS)
    @given(HOW, st.floats(0, 1), st.binary(min_size=1, max_size=16), st.integers(0, 10**6))
    def case(how, at, noise, seed):
        f = tmp_path / "convs.jsonl"
        f.write_bytes(corrupt(CONV_BYTES, how, at, noise, seed))
        cases["conversations (data curate)"] += 1
        check(run(["data", "curate", str(f), "--out", str(tmp_path / "out"), "--max-reject-rate", "0.5", "--json"]))

    case()
    assert cases["conversations (data curate)"] >= 100


# --------------------------------------------------------------------------- checkpoints

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A small NemotronH checkpoint with a trained BPE tokenizer.json, as the pipeline saves one."""
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from stagewise.data.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("ckpt") / "step-00000010"
    cfg = NemotronHConfig(vocab_size=300, hidden_size=32, hybrid_override_pattern="M*-", num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, intermediate_size=64, mamba_num_heads=2,
                          mamba_head_dim=16, ssm_state_size=8, n_groups=1, chunk_size=16, max_position_embeddings=128)
    cfg.architectures = ["NemotronHForCausalLM"]
    torch.manual_seed(0)
    NemotronHForCausalLM(cfg).save_pretrained(root)
    train_bpe(DOCS * 3, 300).save_pretrained(root)  # tokenizer.json, tokenizer_config.json (eos) as prepare saves them
    (root / "stagewise.json").write_text(json.dumps({"step": 10, "tokens_seen": 1000}))
    return root


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def test_the_pristine_checkpoint_passes(checkpoint, tmp_path, cli):
    run, _, _ = cli
    o = run(["inspect", str(checkpoint), "--json"])
    assert o.code == 0, o.describe()
    from stagewise.model.checkpoint_check import check_checkpoint

    assert check_checkpoint(checkpoint, tokenizer=True)["hidden_size"] == 32


@pytest.mark.parametrize("name,why", [("config.json", "not valid JSON"), ("model.safetensors", "truncated"),
                                      ("tokenizer.json", "not a loadable tokenizer")])
def test_the_issue_examples_exit_2_naming_the_file(checkpoint, tmp_path, cli, name, why):
    run, check, _ = cli
    bad = _copy(checkpoint, tmp_path / "bad")
    (bad / name).write_bytes((bad / name).read_bytes()[:-7])
    argv = (["data", "pack", str(tmp_path / "c.jsonl"), "--tokenizer", str(bad), "--pack-size", "64"]
            if name == "tokenizer.json" else ["inspect", str(bad)])
    (tmp_path / "c.jsonl").write_bytes(CONV_BYTES)
    o = run(argv)
    check(o)
    assert o.code == 2 and name in o.err and why in o.err, o.describe()


def test_corrupted_checkpoints(checkpoint, tmp_path, cli):
    run, check, cases = cli
    (tmp_path / "c.jsonl").write_bytes(CONV_BYTES)
    good = _copy(checkpoint, tmp_path / "good")

    @example("config.json", "shape", 0.0, b"x", 1, "inspect")
    @example("model.safetensors", "bytes", 0.0, b"\xff" * 8, 0, "merge")
    @settings(max_examples=220, **SETTINGS)
    @given(st.sampled_from(["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                            "stagewise.json", "(missing)"]), HOW,
           st.floats(0, 1), st.binary(min_size=1, max_size=16), st.integers(0, 10**6),
           st.sampled_from(["inspect", "inspect", "merge", "pack"]))
    def case(name, how, at, noise, seed, command):
        bad = _copy(checkpoint, tmp_path / "bad")
        if name == "(missing)":
            (bad / random.Random(seed).choice(["config.json", "model.safetensors", "tokenizer.json",
                                                "tokenizer_config.json"])).unlink()
        elif name == "model.safetensors" and how in ("latin1", "utf16", "shape"):
            (bad / name).write_bytes((bad / name).read_bytes()[: int(at * 200)])  # header damage
        else:
            (bad / name).write_bytes(corrupt((bad / name).read_bytes(), how, at, noise, seed))
        argv = {"inspect": ["inspect", str(bad), "--json"],
                "merge": ["merge", str(good), str(bad), "--out", str(tmp_path / "merged"), "--json"],
                "pack": ["data", "pack", str(tmp_path / "c.jsonl"), "--tokenizer", str(bad), "--pack-size", "64", "--json"]}[command]
        cases["checkpoints"] += 1
        check(run(argv))

    case()
    assert cases["checkpoints"] >= 220


# --------------------------------------------------------------------------- gate / cutoff rules

RULE = b"""all:
  - {metric: eval/world_arithmetic/exact_match, op: ">=", value: 0.3}
any:
  - {metric: eval/validation/loss, op: "<", value: -0.2, relative: true}
guards:
  - {metric: eval/world_lookup/exact_match, max_drop: 0.05}
min_tokens: 1000
"""


def test_corrupted_rule_files_through_cutoffs(tmp_path, cli):
    run, check, cases = cli

    @example("shape", 0.0, b"x", 5)
    @settings(max_examples=150, **SETTINGS)
    @given(HOW, st.floats(0, 1), st.binary(min_size=1, max_size=16), st.integers(0, 10**6))
    def case(how, at, noise, seed):
        f = tmp_path / "rule.yaml"
        f.write_bytes(corrupt(RULE, how, at, noise, seed))
        cases["rule files (cutoffs)"] += 1
        o = run(["cutoffs", "--experiment", "x", "--stage", "pretrain", "--rule", str(f),
                 "--tracking-uri", f"sqlite:///{tmp_path / 'no.db'}"])
        check(o)
        assert o.code == 2  # a good rule still has no MLflow store to read here

    case()
    assert cases["rule files (cutoffs)"] >= 150
