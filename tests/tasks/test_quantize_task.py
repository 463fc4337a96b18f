"""The quantize task on a saved checkpoint: the Ultra preset end to end (plan, quantize, export, reload, score)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stagewise.eval.scoring import Scoring
from stagewise.quant.calibration import stream_batches
from stagewise.quant.config import QuantizeConfig
from stagewise.tasks.quantize import quantize_checkpoint


def test_ultra_preset_exports_what_its_report_says(tiny_checkpoint, tmp_path):
    rng = np.random.default_rng(0)
    streams = {"a": rng.integers(0, 300, 4000), "b": rng.integers(0, 300, 4000)}
    batches = stream_batches(streams, 2, 2, 64)
    out = tmp_path / "export"
    meta = {"stage": "quantize", "step": 0, "tokens_seen": 0, "recipe_hash": "r", "parent": str(tiny_checkpoint)}
    report = quantize_checkpoint.fn(str(tiny_checkpoint), QuantizeConfig(preset="ultra"), batches,
                                    Scoring(streams=streams, seq_length=64, val_tokens=1024), str(out), "cpu", meta)
    kinds = {row["module"]: row["kind"] for row in report["table"]}
    assert report["method"] == "ultra-heuristic"
    assert all(report["formats"][m] == "nvfp4" for m, k in kinds.items() if k == "routed_experts")
    assert all(report["formats"][m] == "fp8" for m, k in kinds.items() if k in ("shared_expert", "mamba_in", "mamba_out"))
    assert all(report["formats"][m] == "bf16" for m, k in kinds.items() if k in ("attn_qkv", "attn_out", "lm_head", "mlp"))
    assert report["recounted_bits"] == pytest.approx(report["effective_bits"])
    assert set(report["bf16"]) == set(report["quantized"]) == {"validation/loss"}
    assert 0 < abs(report["deltas"]["validation/loss"]) < 0.5  # quantized: close, not identical
    meta_doc = json.loads((out / "stagewise.json").read_text())
    assert meta_doc["parent"] == str(tiny_checkpoint) and len(meta_doc["weight_sha256"]) == 64
    assert sum(report["flop_share"].values()) == pytest.approx(1.0)
