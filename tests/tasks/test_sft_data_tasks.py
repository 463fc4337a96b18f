"""SFT data tasks: each task's body (`.fn`) on a small world, without Prefect or MLflow (the library
functions they call are tested in tests/data/test_sft_assembly.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagewise.data.sft_config import CurateConfig, SFTBlend, SFTDataSource, SFTWorldConfig
from stagewise.recipe import SFTSubStage
from stagewise.store.steps import value_of
from stagewise.tasks.sft_data import (
    PackedRef,
    SFTDataError,
    blend_pack_task,
    curate_task,
    sft_start_task,
    sft_world_task,
)

SOURCES = [SFTDataSource(name=n, path=f"@world/sft_{n}.jsonl") for n in ("arithmetic", "sorting", "lookup")]


def run(task, *args):
    """A task's body as a flow sees it: the value, whether it was built or reused (a Cached state)."""
    return value_of(task.fn(*args))


# --------------------------------------------------------------------------- tasks on a small world

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sftw")
    cfg = SFTWorldConfig(per_domain=40, long_context=2, eval_fraction=0.1)
    return workdir, Path(run(sft_world_task, cfg, 100, 3, str(workdir)))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, world):
    """A tiny pretrain-like checkpoint: random NemotronH weights, a BPE without a chat template."""
    from stagewise.data.tokenizer import train_bpe
    from stagewise.model.build import build_model
    from stagewise.model.checkpoint import CheckpointMeta, save_checkpoint
    from stagewise.model.config import ModelConfig

    _, world_dir = world
    texts = [line for f in sorted(world_dir.glob("sft_*.jsonl")) for line in f.read_text().splitlines()]
    tok_dir = tmp_path_factory.mktemp("tok")
    train_bpe(texts, 600).save_pretrained(tok_dir)
    model = build_model(ModelConfig(preset="tiny", overrides={"hidden_size": 64, "intermediate_size": 128}),
                        vocab_size=600, seed=0)
    out = tmp_path_factory.mktemp("pre") / "step-00000010"
    return save_checkpoint(out, model, tok_dir, CheckpointMeta("pretrain", 10, 40960, "h", None))


def test_world_is_generated_once(world):
    workdir, world_dir = world
    assert {p.name for p in world_dir.iterdir()} >= {"sft_arithmetic.jsonl", "sft_eval.jsonl", "sft_dirty.jsonl"}
    before = (world_dir / "sft_eval.jsonl").stat().st_mtime_ns
    state = sft_world_task.fn(SFTWorldConfig(per_domain=40, long_context=2, eval_fraction=0.1), 100, 3, str(workdir))
    assert state.name == "Cached" and "reused" in state.message  # Prefect shows the reuse
    again = value_of(state)
    assert Path(again) == world_dir and (world_dir / "sft_eval.jsonl").stat().st_mtime_ns == before
    other = run(sft_world_task, SFTWorldConfig(per_domain=40, long_context=2, eval_fraction=0.1), 100, 4, str(workdir))
    assert Path(other) != world_dir  # the seed is part of the name


def test_curate_keeps_clean_sources_and_reports_rejects(world):
    workdir, world_dir = world
    sources = SOURCES + [SFTDataSource(name="dirty", path="@world/sft_dirty.jsonl", domain="lookup", max_reject_rate=0.3)]
    ref = run(curate_task, sources, CurateConfig(), str(world_dir), str(workdir), str(workdir))
    root = Path(ref.root)
    assert ref.domains == {"arithmetic": "arithmetic", "sorting": "sorting", "lookup": "lookup", "dirty": "lookup"}
    summary = json.loads((root / "summary.json").read_text())
    assert summary["dirty"]["kept"] == 80 and summary["dirty"]["rejected"]["malformed_json"] == 2
    assert len((root / "dirty.rejects.jsonl").read_text().splitlines()) == 16
    assert sum(1 for _ in open(ref.files["arithmetic"])) == summary["arithmetic"]["kept"] > 0
    again = run(curate_task, sources, CurateConfig(), str(world_dir), str(workdir), str(workdir))
    assert again == ref
    changed = run(curate_task, sources, CurateConfig(near_dedup=False), str(world_dir), str(workdir), str(workdir))
    assert changed.digest != ref.digest


def test_curation_error_stops_with_the_source_named(world):
    from stagewise.data.curate import CurationError

    workdir, world_dir = world
    dirty = [SFTDataSource(name="dirty", path="@world/sft_dirty.jsonl")]
    with pytest.raises(CurationError, match="source 'dirty': .* above max_reject_rate 5.0%") as info:
        run(curate_task, dirty, CurateConfig(max_reject_rate=0.05), str(world_dir), str(workdir), str(workdir))
    kept = Path(str(info.value).rsplit("rejects in ", 1)[1])  # the rejects outlive the failed attempt
    assert kept.parent.name.endswith(".failed") and len(kept.read_text().splitlines()) == 16
    with pytest.raises(FileNotFoundError, match="missing: .*nope.jsonl"):
        run(curate_task, [SFTDataSource(name="missing", path="nope.jsonl")], CurateConfig(), str(world_dir),
                       str(workdir), str(workdir))


def test_start_checkpoint_gets_the_chat_template_and_eos(world, checkpoint):
    from transformers import AutoTokenizer

    from stagewise.model.checkpoint import read_meta, weights_sha256

    workdir, _ = world
    before = {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()}
    ref = run(sft_start_task, str(checkpoint), str(workdir))
    start = Path(ref.path)
    tok = AutoTokenizer.from_pretrained(start)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert im_end in json.loads((start / "generation_config.json").read_text())["eos_token_id"]
    assert ref.sha256 == read_meta(checkpoint).weight_sha256 == weights_sha256(start)
    assert (ref.step, ref.tokens_seen) == (10, 40960)
    assert {p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()} == before  # the input is untouched
    assert run(sft_start_task, str(checkpoint), str(workdir)) == ref


def _sub(name: str, **kw) -> SFTSubStage:
    base = dict(name=name, tokens=4096, seq_length=512, global_batch=2, micro_batch=1,
                blend=SFTBlend(weights={"arithmetic": 1, "sorting": 1}))
    return SFTSubStage(**(base | kw))


def test_blend_pack_with_keep_previous(world, checkpoint):
    from stagewise.data.sft_packs import load_packed

    workdir, world_dir = world
    curated = run(curate_task, SOURCES, CurateConfig(), str(world_dir), str(workdir), str(workdir))
    start = run(sft_start_task, str(checkpoint), str(workdir))
    one = run(blend_pack_task, _sub("one", blend=SFTBlend(weights={"arithmetic": 1, "sorting": 1}, conversations=40,
                                                              reasoning_off_fraction=0.5)),
                             0, curated, None, start.path, 3, str(workdir))
    assert isinstance(one, PackedRef) and one.report["conversations"] == 40 and one.report["dropped"] == 0
    assert one.report["reasoning_off"] > 0 and 0.5 < one.report["efficiency"] <= 1
    assert one.mixture == {"arithmetic": 0.5, "kept_previous": 0.0, "sorting": 0.5}
    rows = load_packed(one.rows)
    assert rows["input_ids"].shape == (one.report["packs"], 512)
    two = run(blend_pack_task, _sub("two", blend=SFTBlend(weights={"lookup": 1}, conversations=20), keep_previous=0.5),
                             1, curated, one, start.path, 3, str(workdir))
    assert two.report["conversations"] == 40 and two.mixture["kept_previous"] == 0.5
    assert two.mixture["lookup"] == 0.5 and two.mixture["arithmetic"] + two.mixture["sorting"] == 0.5
    same = run(blend_pack_task, _sub("two", blend=SFTBlend(weights={"lookup": 1}, conversations=20), keep_previous=0.5),
                              1, curated, one, start.path, 3, str(workdir))
    assert same.digest == two.digest and same.root == two.root
    with pytest.raises(SFTDataError, match="fewer than one global batch"):
        run(blend_pack_task, _sub("big", tokens=32768, global_batch=64, micro_batch=1, blend=SFTBlend(weights={"sorting": 1}, conversations=8)),
                           0, curated, None, start.path, 3, str(workdir))
