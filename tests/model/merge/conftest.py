"""Fixtures for the merge tests: checkpoint directories holding tensors the test chooses.

`write_ckpt(dir, tensors, tokens_seen, config=..., shards=None)` writes config.json, the
weights (one model.safetensors, or `shards` files with an index) and stagewise.json, so a
merge's output can be compared with a weighted sum computed by hand.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from stagewise.model.checkpoint import CheckpointMeta, weights_sha256

CONFIG = {"model_type": "toy", "hidden_size": 4, "architectures": ["Toy"]}


def write_ckpt(root: Path, tensors: dict[str, torch.Tensor], tokens_seen: int, config: dict | None = None,
               shards: int | None = None, step: int | None = None) -> Path:
    root.mkdir(parents=True)
    cfg = dict(config or CONFIG) | {"_name_or_path": str(root), "transformers_version": f"5.{tokens_seen}"}
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer_config.json").write_text('{"tok": true}')
    if shards is None:
        save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    else:
        names = sorted(tensors)
        weight_map = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[s::shards]}
            save_file(part, root / file, metadata={"format": "pt"})
            weight_map |= dict.fromkeys(part, file)
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    meta = CheckpointMeta("pretrain", step if step is not None else tokens_seen // 10, tokens_seen, "rh", None,
                          weights_sha256(root))
    (root / "stagewise.json").write_text(json.dumps(asdict(meta)))
    return root


@pytest.fixture
def ckpt_writer():
    return write_ckpt
