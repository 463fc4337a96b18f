"""prepare_data: world -> tokenizer -> shards -> manifest, reused by content digest."""

import json
from dataclasses import replace

import numpy as np
import pytest
from transformers import AutoTokenizer

import stagewise.data.prepare as prepare_mod
from stagewise.data.config import DataConfig, PhaseConfig, SourceConfig, TokenizerConfig, WorldConfig
from stagewise.data.digest import digest_of, prepare_inputs
from stagewise.data.loader import PretrainBatches
from stagewise.data.prepare import PreparedData, prepare_data
from stagewise.data.shards import TokenShard

WORLD = WorldConfig(stdlib_files=2, facts=40, arithmetic=40, retrieval=6, noisy=20)
TOK = TokenizerConfig(vocab_size=400)


def _data(local_path="local.jsonl", **kw):
    sources = [SourceConfig(name="facts", path="@world/facts.jsonl", quality="high"),
               SourceConfig(name="noisy", path="@world/noisy.jsonl", quality="low"),
               SourceConfig(name="local", path=local_path, **kw)]
    return DataConfig(world=WORLD, sources=sources, validation_fraction=0.1)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("recipe")
    (base / "local.jsonl").write_text("".join(json.dumps({"text": f"local doc {i}"}) + "\n" for i in range(30)))
    workdir = base / "runs"
    return base, workdir, prepare_data(_data(), TOK, workdir, seed=3, base_dir=base, progress=False)


def test_layout_and_manifest(env):
    base, workdir, p = env
    assert not p.reused and p.root.parent == workdir / "data" and p.root.name == p.digest[:16]
    assert (p.root / "manifest.json").is_file() and p.tokenizer_dir == p.root / "tokenizer"
    assert PreparedData.load(p.root) == replace(p, reused=True)
    tok = AutoTokenizer.from_pretrained(p.tokenizer_dir)
    assert len(tok) == p.vocab_size and tok.eos_token_id == 2
    assert sorted(p.sources) == ["facts", "local", "noisy"]
    for name, s in p.sources.items():
        train, val = TokenShard.open(s.train), TokenShard.open(s.val)
        assert train.n_tokens == s.train_tokens > 0 and val.n_tokens == s.val_tokens > 0
        assert train.n_docs + val.n_docs == s.docs
        assert int(train.tokens.max()) < p.vocab_size
    assert p.sources["local"].docs == 30 and p.sources["facts"].docs == 40
    assert (p.world_dir / "facts.jsonl").is_file()
    assert not [x for x in (workdir / "data").iterdir() if x.name.startswith(".")]


def test_second_prepare_is_reused_without_tokenizing(env, monkeypatch):
    base, workdir, p = env
    monkeypatch.setattr(prepare_mod, "write_source_shards", lambda *a, **k: pytest.fail("re-tokenized"))
    again = prepare_data(_data(), TOK, workdir, seed=3, base_dir=base, progress=False)
    assert again.reused and again.root == p.root and again.digest == p.digest


def test_loader_reads_prepared_data(env):
    _, _, p = env
    phases = [PhaseConfig(name="all", blend={"facts": 1, "noisy": 1, "local": 1})]
    batches = PretrainBatches(p, phases, {"facts": 4, "noisy": 4, "local": 4}, seq_length=16, global_batch=6,
                              total_tokens=6 * 16 * 10, seed=0)
    x = batches.next_batch()
    assert x.shape == (6, 17) and int(x.max()) < p.vocab_size


def _digest(env, *, data=None, tok=TOK, seed=3):
    base, workdir, _ = env
    data = data or _data()
    world = prepare_mod.ensure_world(data.world, seed, workdir) if data.world else None
    return digest_of(prepare_inputs(data, tok, seed, base, world))


def test_digest_covers_inputs(env, tmp_path):
    base, workdir, p = env
    assert _digest(env) == p.digest
    changed = [
        _digest(env, seed=4),
        _digest(env, tok=TokenizerConfig(vocab_size=401)),
        _digest(env, data=_data(text_field="body")),
        _digest(env, data=DataConfig(**{**_data().model_dump(), "validation_fraction": 0.2})),
        _digest(env, data=DataConfig(**{**_data().model_dump(), "world": {**WORLD.model_dump(), "facts": 41}})),
    ]
    assert len(set(changed + [p.digest])) == len(changed) + 1
    same = _digest(env, data=_data(quality="low", max_epochs=9))  # read by the loader, not by prepare
    assert same == p.digest


def test_changed_source_bytes_give_a_new_directory(env):
    base, workdir, p = env
    other = base / "local2.jsonl"
    other.write_text((base / "local.jsonl").read_text())
    assert prepare_data(_data("local2.jsonl"), TOK, workdir, 3, base, progress=False).digest != p.digest  # path is config
    other.write_text((base / "local.jsonl").read_text().replace("doc 7", "doc seven"))
    changed = prepare_data(_data("local2.jsonl"), TOK, workdir, 3, base, progress=False)
    assert not changed.reused and changed.root != p.root and p.root.is_dir()
    texts = np.concatenate([TokenShard.open(changed.sources["local"].train).tokens,
                            TokenShard.open(changed.sources["local"].val).tokens])
    assert "doc seven" in AutoTokenizer.from_pretrained(changed.tokenizer_dir).decode(texts)


def test_skipped_bad_lines_are_counted_in_the_manifest(tmp_path):
    (tmp_path / "local.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(20))
                                          + "{not json\n" + json.dumps({"title": "no text"}) + "\n")
    prepared = prepare_data(_data(on_bad_line="skip"), TOK, tmp_path / "runs", seed=3, base_dir=tmp_path, progress=False)
    assert prepared.sources["local"].bad_lines == 2 and prepared.sources["facts"].bad_lines == 0
    assert PreparedData.load(prepared.root).sources["local"].bad_lines == 2  # kept in manifest.json
