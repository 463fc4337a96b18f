"""Our checkpoints through the released Megatron-Bridge: HF -> Megatron (torch_dist on disk) -> HF, on CPU.

Two checkpoints, built here with our code and saved as our stages save them:
- the demo's: the `tiny` preset with the BPE tokenizer of the `tiny_checkpoint` fixture, fp32;
- one shaped like Nano 30B-A3B: the `nemotron-3-nano-30b-a3b` preset's settings (sigmoid router with
  a correction bias, routed scaling 2.5, a shared expert twice an expert's width, Mamba/MoE
  alternating with attention) at a few layers, a small width and 8 experts, in bf16 as published.
Every tensor that is constant at initialization (norm weights, `D`, the router's correction bias)
gets seeded values first, so an equal value is a carried value, not a re-initialized one.

Each goes to Megatron-Bridge as our stage hands it over (engines/megatron/hf_config.py's copy: the
transformers Megatron-Bridge pins refuses our config.json as it is), through side_env/round_trip.py
under the side environment's interpreter (one process for both: the import is most of its time),
and the export comes back through the stage's adopt path (model.checkpoint.adopt_checkpoint, then
the next stage's `model.from` build). The version line is crossed both ways: the side
environment's transformers refuses our config and reads the copy, and ours reads its export.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from stagewise.engines.megatron.hf_config import megatron_hf_dir
from stagewise.model.build import build_model, load_model
from stagewise.model.checkpoint import CheckpointMeta, _copy_tokenizer, adopt_checkpoint, read_meta, weights_sha256
from stagewise.model.config import ModelConfig

pytestmark = pytest.mark.megatron

SCRIPT = Path(__file__).resolve().parent / "side_env" / "round_trip.py"
NANO_30B_A3B = "nemotron-3-nano-30b-a3b"
TINY_30B_A3B = {  # the preset's sizes made tiny; every other setting stays the published one
    "vocab_size": None, "hybrid_override_pattern": "MEMEM*EME", "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16, "chunk_size": 32,
    "intermediate_size": 64, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 128, "max_position_embeddings": 4096,
}
COMES_BACK_FP32 = "mixer.gate.e_score_correction_bias"
"""Megatron keeps the router's expert bias in fp32 (`moe_router_dtype` fp32, and the bias is a
buffer its bf16 cast leaves alone), and the export writes the tensor as Megatron holds it: a bf16
checkpoint's `backbone.layers.<moe layer>.mixer.gate.e_score_correction_bias` comes back fp32,
with the same values (bf16 -> fp32 is exact). Nothing else changes dtype."""
SIDE_TIMEOUT_S = 420


def _seeded_constants(model: torch.nn.Module, seed: int) -> None:
    """Give every tensor that is one value throughout (norms at 1, D at 1, biases at 0) seeded values
    around it, so the round trip has to carry each element."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in sorted([*model.named_parameters(), *model.named_buffers()]):
            if t.is_floating_point() and t.numel() > 1 and bool((t == t.flatten()[0]).all()):
                t.add_(0.02 * torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype))


def _save(model, tokenizer_dir: Path, out: Path) -> Path:
    model.save_pretrained(out)
    _copy_tokenizer(tokenizer_dir, out)
    return out


def _tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    found = {}
    for path in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            found |= {k: f.get_tensor(k) for k in f.keys()}
    return found


def _run_side(python: Path, args: list[str]) -> dict:
    # Bytecode written: the side environment is ours, and its imports are most of the time.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env |= {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([str(python), str(SCRIPT), *args], capture_output=True, text=True, env=env,
                         timeout=SIDE_TIMEOUT_S, cwd=SCRIPT.parent)
    if run.returncode:
        pytest.fail(f"{SCRIPT.name} exited {run.returncode}:\n{run.stderr[-6000:]}\n{run.stdout[-2000:]}", pytrace=False)
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def round_trips(megatron_python, tiny_checkpoint, tmp_path_factory):
    """{name: (our checkpoint, what Megatron-Bridge was handed, its export)}, plus the side run's report."""
    root = tmp_path_factory.mktemp("round-trip")
    tiny = load_model(tiny_checkpoint)
    _seeded_constants(tiny, 1)
    moe = build_model(ModelConfig(preset=NANO_30B_A3B, overrides=TINY_30B_A3B), tiny.config.vocab_size, seed=0)
    _seeded_constants(moe, 2)
    ours = {"tiny": _save(tiny, tiny_checkpoint, root / "tiny"),
            "nano-30b-a3b-shaped": _save(moe.to(torch.bfloat16), tiny_checkpoint, root / "nano-30b-a3b-shaped")}
    handed = {name: megatron_hf_dir(path, root / f"{name}-megatron-hf") for name, path in ours.items()}
    args = [f"--read-config={ours['tiny']}", f"--read-config={handed['tiny']}"]
    for name, path in handed.items():
        args += [str(path), str(root / f"{name}-work"), str(root / f"{name}-export")]
    t0 = time.monotonic()
    report = _run_side(megatron_python, args)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    print(f"\nround trip in the side environment: {report['wall_s']} s ({report['import_s']} s import): "
          + ", ".join(f"{Path(c['hf_in']).name} {c['params']} params {c['seconds']} s" for c in report["converted"]))
    exports = {name: root / f"{name}-export" for name in ours}
    return {name: (ours[name], handed[name], exports[name]) for name in ours}, report


def test_the_pinned_transformers_refuses_our_config_and_reads_the_copy_we_hand_over(round_trips):
    trips, report = round_trips
    ours, handed, _ = trips["tiny"]
    assert report["transformers"] == "5.12.1"
    refused = report["read"][str(ours)]["error"]
    assert "layers_block_type" in refused and "linear_attention" in refused and "full_attention" in refused
    assert report["read"][str(handed)] == {"layers": ["mamba", "attention", "moe", "mamba", "mlp", "moe"]}
    assert [c["hf_in"] for c in report["converted"]] == [str(h) for _, h, _ in trips.values()]
    assert all(Path(c["megatron_checkpoint"], "metadata.json").is_file() for c in report["converted"])  # torch_dist


@pytest.mark.parametrize("name", ["tiny", "nano-30b-a3b-shaped"])
def test_every_tensor_comes_back_bitwise(round_trips, name):
    """Same names, shapes and values; the same dtype except COMES_BACK_FP32 (asserted as exactly that list)."""
    ours, _, export = round_trips[0][name]
    before, after = _tensors(ours), _tensors(export)
    assert sorted(after) == sorted(before)
    assert len(before) == {"tiny": 71, "nano-30b-a3b-shaped": 128}[name]
    assert not [k for k, t in before.items() if t.numel() > 1 and bool((t == t.flatten()[0]).all())]  # seeded
    changed = sorted(k for k in before if before[k].dtype != after[k].dtype)
    if name == "tiny":  # fp32 throughout: nothing changes
        assert changed == []
    else:
        moe_layers = [i for i, c in enumerate(TINY_30B_A3B["hybrid_override_pattern"]) if c == "E"]
        assert changed == sorted(f"backbone.layers.{i}.{COMES_BACK_FP32}" for i in moe_layers)
        assert {(before[k].dtype, after[k].dtype) for k in changed} == {(torch.bfloat16, torch.float32)}
    for k in before:
        assert after[k].shape == before[k].shape, k
        assert torch.equal(after[k].to(before[k].dtype), before[k]), k
        assert torch.equal(after[k], before[k].to(after[k].dtype)), k  # and exact the other way


@pytest.mark.parametrize("name", ["tiny", "nano-30b-a3b-shaped"])
def test_the_export_is_adopted_and_read_by_our_transformers_with_identical_logits(round_trips, name, tmp_path):
    """The export (config.json written by transformers 5.12: layer kinds mamba/attention) goes through
    run_engine's adopt_checkpoint and is read by ours as the next stage reads `model.from`."""
    ours, _, export = round_trips[0][name]
    assert json.loads((export / "config.json").read_text())["transformers_version"] == "5.12.1"
    meta = CheckpointMeta(stage="pretrain", step=0, tokens_seen=0, recipe_hash="round-trip", extra={"engine": "megatron"})
    adopted = adopt_checkpoint(export, tmp_path / "step-00000000", None, meta)
    assert read_meta(adopted).weight_sha256 == weights_sha256(adopted)
    theirs = build_model(ModelConfig(preset=None, **{"from": str(adopted)}), None, seed=0).eval()
    mine = load_model(ours).eval()
    assert theirs.config.layers_block_type == mine.config.layers_block_type  # read back in our names
    ids = torch.arange(2 * 24).reshape(2, 24) * 7 % mine.config.vocab_size
    with torch.no_grad():
        assert torch.equal(theirs(input_ids=ids).logits, mine(input_ids=ids).logits)
