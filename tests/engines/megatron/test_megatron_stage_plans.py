"""The launches a long-context and an SFT sub-stage hand Megatron-Bridge (engines/megatron/stage.py):
import -> train -> export argvs for a tiny example, and the document-QA shard as an indexed dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagewise.data.indexed_format import index_bytes, read_indexed
from stagewise.data.long_context_config import LengthShare, LongContextDataConfig
from stagewise.data.shards import write_shard
from stagewise.engines.config import EngineEnv, LaunchConfig
from stagewise.engines.megatron.stage import beside, indexed_shards, long_context_plan, sft_plan
from stagewise.engines.megatron.translate import MLflowTarget
from stagewise.model.config import ModelConfig
from stagewise.model.presets import preset_kwargs
from stagewise.recipe import SFTSubStage
from stagewise.recipe.blocks.long_context import LongContextStage

LAUNCH = LaunchConfig(env=EngineEnv(venv="/opt/mb", workdir="/opt/Megatron-Bridge"), gpus_per_node=2)
MLFLOW = MLflowTarget("sqlite:////w/mlflow.db", "tiny", "run1", "sft/stage1")
CONVERT = "scripts/conversion/run_conversion.py"


LAYERS = ["linear_attention", "full_attention", "moe", "linear_attention", "mlp", "moe"]
"""tiny's M*EM-E as our transformers saves it (`layers_block_type`, the names the pinned one refuses)."""
TOKENIZER_FILES = ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
NOT_TOKENIZER = ["model.safetensors", "model.safetensors.index.json", "stagewise.json"]


def _start(tmp_path, name="start"):
    """An HF checkpoint directory of the tiny shape (its config.json is what the translation reads), with
    stand-ins for the tokenizer's files, the weights and our metadata."""
    start = tmp_path / name
    start.mkdir()
    (start / "config.json").write_text(json.dumps({**preset_kwargs("tiny"), "vocab_size": 300,
                                                   "layers_block_type": LAYERS}))
    for f in TOKENIZER_FILES + NOT_TOKENIZER:
        (start / f).write_text(f"{name}/{f}")
    return start


def _assert_run_tokenizer(given: str, tokenizer_dir, out) -> None:
    """The plan's tokenizer is `<out>/megatron-tokenizer`: the tokenizer's files linked, no weights or
    metadata, config.json in the layer names the pinned transformers reads (hf_config.megatron_tokenizer_dir)."""
    tok = out / "megatron-tokenizer"
    assert given == f'"{tok}"'
    assert sorted(p.name for p in tok.iterdir()) == sorted(["config.json", *TOKENIZER_FILES])
    assert all((tok / f).is_symlink() and (tok / f).resolve() == (tokenizer_dir / f).resolve() for f in TOKENIZER_FILES)
    doc = json.loads((tok / "config.json").read_text())
    assert doc["layers_block_type"] == ["mamba", "attention", "moe", "mamba", "mlp", "moe"]


def _overrides(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if "=" in a)


def test_long_context_imports_trains_its_one_length_on_the_blend_and_exports(tmp_path):
    start, out = _start(tmp_path), tmp_path / "lc"
    stage = LongContextStage(tokens=1024, data=LongContextDataConfig(
        lengths=[LengthShare(length=128, share=1.0)], global_batch_tokens=512, micro_batch_tokens=256))
    blend = [("/w/data/p-megatron/web", 0.79), ("/w/data/doc_qa-x-megatron/doc_qa", 0.2),
             ("/w/data/p-megatron/retrieval", 0.01)]
    plan = long_context_plan(stage, ModelConfig(preset=None, **{"from": str(start)}), LAUNCH, str(start), out, 3,
                             MLFLOW, blend)
    imp, train, export = plan.steps
    assert [s.name for s in plan.steps] == ["megatron-import", "megatron-train", "megatron-export"]
    assert (imp.one_node, train.style, export.one_node) == (True, "torchrun", True)
    hf_in = out / "megatron-hf"  # the copy Megatron-Bridge's transformers reads (engines/megatron/hf_config.py)
    assert imp.entry == ["python", CONVERT, "import", "--device", "cpu", "--hf-model", str(hf_in),
                         "--megatron-path", str(out / "megatron-import"), "--torch-dtype", "bfloat16", "--overwrite"]
    assert train.entry[:8] == ["python", "scripts/training/run_recipe.py", "--recipe",
                               "nemotron_3_nano_pretrain_8gpu_h100_bf16_config", "--mode", "pretrain",
                               "--dataset", "megatron-indexed"]
    o = _overrides(train.entry)
    assert (o["dataset.seq_length"], o["train.global_batch_size"], o["train.micro_batch_size"]) == ("128", "4", "2")
    assert o["train.train_iters"] == "2" and o["checkpoint.pretrained_checkpoint"] == \
        f'"{out / "megatron-import" / "iter_0000000"}"'
    assert o["dataset.blend"] == ('[["/w/data/p-megatron/web","/w/data/doc_qa-x-megatron/doc_qa",'
                                  '"/w/data/p-megatron/retrieval"],[0.79,0.2,0.01]]')
    assert o["rng.seed"] == "3" and o["dataset.split"] == '"1,0,0"'  # every document trains
    _assert_run_tokenizer(o["tokenizer.tokenizer_model"], start, out)  # not the checkpoint itself
    assert export.entry == ["python", CONVERT, "export", "--device", "cpu", "--hf-model", str(hf_in),
                            "--megatron-path", str(out / "megatron" / "iter_0000002"), "--hf-path",
                            str(out / "megatron-export"), "--torch-dtype", "bfloat16", "--overwrite"]
    assert (plan.export_dir, plan.step, plan.tokens) == (out / "megatron-export", 2, 1024)


def test_an_sft_sub_stage_reads_its_chat_rows_through_the_chat_preprocessing(tmp_path):
    start, chat, out = _start(tmp_path), _start(tmp_path, "chat-start"), tmp_path / "stage1"
    sub = SFTSubStage(name="stage1", tokens=2048, seq_length=512, global_batch=2, micro_batch=1,
                      blend={"weights": {"arithmetic": 1}}, precision="bf16")
    plan = sft_plan(sub, ModelConfig(preset=None, **{"from": str(start)}), LAUNCH, str(start), str(chat),
                    out / "megatron-data", out, 3, MLFLOW, field="stages.sft.stages[0]")
    assert [s.name for s in plan.steps] == ["megatron-import-stage1", "megatron-train-stage1", "megatron-export-stage1"]
    train = plan.steps[1].entry
    assert train[2:8] == ["--recipe", "nemotron_3_nano_sft_8gpu_h100_bf16_config", "--mode", "sft",
                          "--dataset", "local-jsonl"]
    assert train[-5:] == [f'dataset.dataset_root="{out / "megatron-data"}"', "dataset.preprocessing=null",
                          '+dataset.preprocessing={_target_:"megatron.bridge.data.sft_processing.'
                          'ChatSFTPreprocessingConfig",loss_mode:"assistant"}',
                          "dataset.do_validation=false", "dataset.do_test=false"]
    o = _overrides(train)
    _assert_run_tokenizer(o["tokenizer.tokenizer_model"], chat, out)  # the chat tokenizer, not the start's
    assert "dataset.split" not in o
    assert o["dataset.offline_packing_specs"] == ('{_target_:"megatron.bridge.data.packing.PackedSequenceSpecs",'
                                                  'packed_sequence_size:512,pad_seq_to_mult:1}')
    assert o["model.calculate_per_token_loss"] == "true" and o["train.train_iters"] == "2"
    assert plan.steps[2].entry[plan.steps[2].entry.index("--megatron-path") + 1] == str(out / "megatron" / "iter_0000002")
    for step in (plan.steps[0], plan.steps[2]):  # import and export read the copy, not the checkpoint itself
        assert step.entry[step.entry.index("--hf-model") + 1] == str(out / "megatron-hf")
    assert (plan.step, plan.tokens) == (2, 2048)


def test_the_doc_qa_shard_becomes_an_indexed_dataset_beside_its_directory(tmp_path):
    docs = [[5, 6, 0], [7, 8, 9, 0]]
    train = tmp_path / "doc_qa-abc" / "train"
    tokens = write_shard(train, [np.array(d) for d in docs], vocab_size=300, eos_id=0).tokens
    prefixes = indexed_shards({"doc_qa": train}, beside(train.parent))
    assert prefixes == {"doc_qa": tmp_path / "doc_qa-abc-megatron" / "doc_qa"}
    assert (tmp_path / "doc_qa-abc-megatron" / "doc_qa.bin").read_bytes() == tokens.astype("<u2").tobytes()
    assert (tmp_path / "doc_qa-abc-megatron" / "doc_qa.idx").read_bytes() == index_bytes(np.array([0, 3, 7]), tokens.dtype)
    assert [d.tolist() for d in read_indexed(prefixes["doc_qa"])] == docs


def test_megatron_bridge_is_handed_a_copy_in_the_layer_names_its_transformers_reads(tiny_checkpoint, tmp_path):
    """Our transformers (5.24) writes layer kinds linear_attention/full_attention; the one Megatron-Bridge
    pins (5.12) reads only mamba/attention. The copy renames them, links every other file, and still
    reads as the same config under ours (the released library reading it: test_real_round_trip.py)."""
    from transformers import AutoConfig

    from stagewise.engines.megatron.hf_config import megatron_hf_dir

    ours = json.loads((tiny_checkpoint / "config.json").read_text())
    assert set(ours["layers_block_type"]) == {"linear_attention", "full_attention", "moe", "mlp"}
    copy = megatron_hf_dir(tiny_checkpoint, tmp_path / "megatron-hf")
    doc = json.loads((copy / "config.json").read_text())
    assert doc["layers_block_type"] == ["mamba", "attention", "moe", "mamba", "mlp", "moe"]
    assert doc["mtp_layers_block_type"] == ["attention", "moe"]
    assert {k: v for k, v in doc.items() if "layers_block_type" not in k} == \
        {k: v for k, v in ours.items() if "layers_block_type" not in k}
    others = sorted(p.name for p in tiny_checkpoint.iterdir() if p.name != "config.json")
    assert sorted(p.name for p in copy.iterdir() if p.name != "config.json") == others
    assert all((copy / n).is_symlink() and (copy / n).resolve() == (tiny_checkpoint / n).resolve() for n in others)
    same = {"_name_or_path": None, "transformers_version": None}
    assert AutoConfig.from_pretrained(copy).to_dict() | same == AutoConfig.from_pretrained(tiny_checkpoint).to_dict() | same
    assert megatron_hf_dir(tiny_checkpoint, copy) == copy  # made afresh, again


def test_the_run_tokenizer_is_the_tokenizers_own_files(tiny_checkpoint, tmp_path):
    """megatron_tokenizer_dir of a saved checkpoint: every file but the weights (and our metadata),
    config.json rewritten; of a tokenizer alone (as data prepare leaves one): its files, no config.json.
    Our transformers reads both as the checkpoint's tokenizer (the release reading the first:
    test_real_plans.py)."""
    from transformers import AutoTokenizer

    from stagewise.engines.megatron.hf_config import megatron_tokenizer_dir
    from stagewise.model.checkpoint import _is_weights

    tok = megatron_tokenizer_dir(tiny_checkpoint, tmp_path / "tok")
    kept = sorted(p.name for p in tiny_checkpoint.iterdir() if p.is_file() and not _is_weights(p.name)
                  and p.name != "stagewise.json")
    assert sorted(p.name for p in tok.iterdir()) == kept and "config.json" in kept
    assert not any(_is_weights(p.name) for p in tok.iterdir())
    assert json.loads((tok / "config.json").read_text())["layers_block_type"][:2] == ["mamba", "attention"]
    ours = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert AutoTokenizer.from_pretrained(tok).get_vocab() == ours.get_vocab()
    alone = tmp_path / "alone"
    ours.save_pretrained(alone)
    copy = megatron_tokenizer_dir(alone, tmp_path / "alone-tok")
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in alone.iterdir())
    assert not (copy / "config.json").exists()
    assert megatron_tokenizer_dir(alone, copy) == copy  # made afresh, again
    with pytest.raises(FileNotFoundError, match="tokenizer_config.json"):
        megatron_tokenizer_dir(tmp_path / "nothing", tmp_path / "x")
