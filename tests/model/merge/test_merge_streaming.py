"""The streaming merge: exact weighted sums, refusals naming the first mismatch, the output
checkpoint (manifest, metadata, atomicity) and loading it back with transformers."""

import json

import pytest
import torch
from safetensors.torch import load_file

from stagewise.model.checkpoint import CheckpointMeta, read_meta, save_checkpoint, weights_sha256
from stagewise.model.merge import MANIFEST, MergeInputError, merge_checkpoints, merge_coefficients


def _known(i: int) -> dict[str, torch.Tensor]:
    """Small integers: every weighted sum with power-of-two coefficients is exact in fp32 and bf16."""
    return {
        "a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4) * (i + 1),
        "b.bias": torch.full((5,), float(i * 4), dtype=torch.float32),
        "c.half": (torch.arange(6, dtype=torch.float32) + i * 2).to(torch.bfloat16),
        "d.steps": torch.tensor([7, 8, 9], dtype=torch.int64),  # non-float: must be equal
    }


@pytest.mark.parametrize("shards", [None, 2])
def test_merge_is_exactly_the_weighted_sum(tmp_path, ckpt_writer, shards):
    ins = [ckpt_writer(tmp_path / f"c{i}", _known(i), 100 * (i + 1), shards=shards) for i in range(3)]
    coeffs = [0.5, 0.25, 0.25]
    out = merge_checkpoints(ins, coeffs, tmp_path / "merged", "custom")
    got = {}
    for f in sorted(out.glob("*.safetensors")):
        got |= load_file(f)
    srcs = [_known(i) for i in range(3)]
    for name in ("a.weight", "b.bias"):
        want = sum(c * s[name].double() for c, s in zip(coeffs, srcs))
        assert got[name].dtype == torch.float32 and torch.equal(got[name].double(), want)
    want_half = sum(c * s["c.half"].double() for c, s in zip(coeffs, srcs))
    assert got["c.half"].dtype == torch.bfloat16 and torch.equal(got["c.half"].double(), want_half)
    assert torch.equal(got["d.steps"], torch.tensor([7, 8, 9]))
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(p.name for p in ins[0].glob("*.safetensors"))
    if shards:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(srcs[0]) and index["metadata"]["total_size"] > 0
    assert read_meta(out).weight_sha256 == weights_sha256(out)  # hashed while writing, same rule


def test_random_tensors_match_an_fp64_reference(tmp_path, ckpt_writer):
    g = torch.Generator().manual_seed(0)
    srcs = [{"w": torch.randn(64, 32, generator=g)} for _ in range(5)]
    ins = [ckpt_writer(tmp_path / f"c{i}", s, 10 * i) for i, s in enumerate(srcs)]
    coeffs = merge_coefficients(5)
    out = merge_checkpoints(ins, coeffs, tmp_path / "m", "minus-sqrt")
    want = sum(c * s["w"].double() for c, s in zip(coeffs, srcs))
    assert torch.allclose(load_file(out / "model.safetensors")["w"].double(), want, atol=1e-6)


def test_output_checkpoint_metadata_and_manifest(tmp_path, ckpt_writer):
    ins = [ckpt_writer(tmp_path / f"c{i}", _known(i), t) for i, t in enumerate([100, 300, 200])]
    coeffs = merge_coefficients(3, "cosine", "reversed")
    out = merge_checkpoints(ins, coeffs, tmp_path / "m", "cosine", ordering="reversed", window_tokens=200)
    meta = read_meta(out)
    assert meta.stage == "merge" and meta.tokens_seen == 300 and meta.parent == str(ins[1].resolve())
    assert meta.weight_sha256 == weights_sha256(out) and meta.step == 30
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["schedule"] == "cosine" and manifest["ordering"] == "reversed"
    assert manifest["coefficients"] == coeffs and manifest["window_tokens"] == 200
    assert [i["tokens_seen"] for i in manifest["inputs"]] == [100, 300, 200]
    assert [i["sha256"] for i in manifest["inputs"]] == [weights_sha256(p) for p in ins]
    assert (out / "tokenizer_config.json").read_text() == '{"tok": true}'
    assert json.loads((out / "config.json").read_text())["_name_or_path"] == str(ins[1])  # the newest's
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left behind


def test_ignored_config_keys_do_not_block_a_merge(tmp_path, ckpt_writer):
    # write_ckpt gives every checkpoint its own _name_or_path and transformers_version
    ins = [ckpt_writer(tmp_path / f"c{i}", _known(0), i) for i in range(2)]
    merge_checkpoints(ins, [0.5, 0.5], tmp_path / "m", "uniform")


@pytest.mark.parametrize("change, message", [
    (lambda t, c: (t, c | {"hidden_size": 8}), r"config.json differs at 'hidden_size': 4 in .*c0 vs 8 in .*c1"),
    (lambda t, c: ({**t, "e.extra": torch.zeros(1)}, c), r"tensor e.extra is in .*c1 but not in .*c0"),
    (lambda t, c: ({k: v for k, v in t.items() if k != "b.bias"}, c), r"tensor b.bias is in .*c0 but not in .*c1"),
    (lambda t, c: ({**t, "a.weight": t["a.weight"].reshape(4, 3)}, c), r"tensor a.weight: shape \[3, 4\] in .*c0 vs \[4, 3\]"),
    (lambda t, c: ({**t, "b.bias": t["b.bias"].half()}, c), r"tensor b.bias: dtype F32 in .*c0 vs F16 in .*c1"),
    (lambda t, c: ({**t, "d.steps": torch.tensor([7, 8, 10])}, c), r"non-float tensor d.steps \(I64\) differs"),
])
def test_mismatched_checkpoints_are_refused_naming_the_first_mismatch(tmp_path, ckpt_writer, change, message):
    config = {"model_type": "toy", "hidden_size": 4}
    a = ckpt_writer(tmp_path / "c0", _known(0), 10, config=config)
    tensors, cfg = change(_known(1), config)
    b = ckpt_writer(tmp_path / "c1", tensors, 20, config=cfg)
    with pytest.raises(MergeInputError, match=message):
        merge_checkpoints([a, b], [0.5, 0.5], tmp_path / "m", "uniform")
    assert not (tmp_path / "m").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_coefficients_and_output_are_refused(tmp_path, ckpt_writer):
    ins = [ckpt_writer(tmp_path / f"c{i}", _known(i), i) for i in range(2)]
    with pytest.raises(MergeInputError, match="sum to 1"):
        merge_checkpoints(ins, [0.5, 0.6], tmp_path / "m", "x")
    with pytest.raises(MergeInputError, match="2 checkpoints but 3 coefficients"):
        merge_checkpoints(ins, [0.5, 0.25, 0.25], tmp_path / "m", "x")
    with pytest.raises(MergeInputError, match="one of the inputs"):
        merge_checkpoints(ins, [0.5, 0.5], ins[0], "x")


def test_a_corrupt_input_is_refused(tmp_path, ckpt_writer):
    ins = [ckpt_writer(tmp_path / f"c{i}", _known(i), i) for i in range(2)]
    data = bytearray((ins[1] / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (ins[1] / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(MergeInputError, match="modified or corrupt"):
        merge_checkpoints(ins, [0.5, 0.5], tmp_path / "m", "uniform", verify_inputs=True)
    # without verification the recorded hash goes into the manifest unread
    out = merge_checkpoints(ins, [0.5, 0.5], tmp_path / "m", "uniform")
    recorded = json.loads((ins[1] / "stagewise.json").read_text())["weight_sha256"]
    assert json.loads((out / MANIFEST).read_text())["inputs"][1]["sha256"] == recorded


def test_inputs_without_a_recorded_hash_are_hashed(tmp_path, ckpt_writer):
    ins = [ckpt_writer(tmp_path / f"c{i}", _known(i), i) for i in range(2)]
    (ins[0] / "stagewise.json").unlink()
    out = merge_checkpoints(ins, [0.5, 0.5], tmp_path / "m", "uniform")
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["inputs"][0]["sha256"] == weights_sha256(ins[0]) and manifest["inputs"][0]["tokens_seen"] is None
    assert read_meta(out).parent == str(ins[1].resolve())


def test_merged_nemotronh_checkpoint_loads_with_automodel(tmp_path, model_factory, tokenizer_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    models = [model_factory(seed=s) for s in range(3)]
    ins = [save_checkpoint(tmp_path / f"step-{i}", m, tokenizer_dir, CheckpointMeta("pretrain", i, 1000 * i, "rh"))
           for i, m in enumerate(models)]
    coeffs = merge_coefficients(3)
    out = merge_checkpoints(ins, coeffs, tmp_path / "merged", "minus-sqrt")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    states = [m.state_dict() for m in models]
    for name, value in loaded.state_dict().items():
        want = sum(c * s[name].double() for c, s in zip(coeffs, states))
        assert torch.allclose(value.double(), want, atol=1e-6), name
    with torch.no_grad():
        assert torch.isfinite(loaded(input_ids=torch.tensor([[3, 4, 5, 6]])).logits).all()
