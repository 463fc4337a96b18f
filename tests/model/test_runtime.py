"""The runtime block: auto picks what the machine has; asking for what it lacks is bad input."""

from __future__ import annotations

import pytest
import torch

from model.runtime import Runtime, RuntimeConfig, RuntimeUnavailable, resolve_runtime


def test_auto_on_a_cpu_machine_is_cpu_fp32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_runtime(RuntimeConfig()) == Runtime(device="cpu", precision="fp32")


def test_auto_on_a_bf16_gpu_is_cuda_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_runtime(RuntimeConfig()) == Runtime(device="cuda", precision="bf16")
    assert resolve_runtime(RuntimeConfig(device="cpu")) == Runtime(device="cpu", precision="fp32")
    assert resolve_runtime(RuntimeConfig(precision="fp32")) == Runtime(device="cuda", precision="fp32")


def test_cuda_without_a_gpu_names_the_field(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeUnavailable, match="torch sees no CUDA device") as e:
        resolve_runtime(RuntimeConfig(device="cuda"))
    assert e.value.field == "runtime.device"


def test_a_stage_precision_wins_over_the_runtime():
    rt = Runtime(device="cuda", precision="bf16")
    assert rt.precision_for("auto") == "bf16" and rt.precision_for("fp32") == "fp32"
    assert rt.params() == {"runtime.device": "cuda", "runtime.precision": "bf16"}
