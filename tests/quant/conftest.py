"""One tiny NemotronH and a few random batches for the quantization tests (searching is the slow part)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_model():
    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    model = build_model(ModelConfig(preset="tiny"), 4096, 0)
    model.config.architectures = ["NemotronHForCausalLM"]
    return model.eval()


@pytest.fixture(scope="session")
def batches():
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(4):
        ids = torch.randint(0, 4096, (2, 48), generator=g)
        out.append({"input_ids": ids, "labels": ids})
    return out
