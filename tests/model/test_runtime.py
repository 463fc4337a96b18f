"""The runtime block: auto picks what the machine has; asking for what it lacks is bad input."""

from __future__ import annotations

import pytest
import torch

from stagewise.model.runtime import Runtime, RuntimeConfig, RuntimeUnavailable, resolve_runtime


def test_auto_on_a_cpu_machine_is_cpu_fp32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_runtime(RuntimeConfig()) == Runtime(device="cpu", precision="fp32")


def test_auto_on_a_bf16_gpu_is_cuda_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    def got(cfg):
        rt = resolve_runtime(cfg)
        return rt.device, rt.precision

    assert got(RuntimeConfig()) == ("cuda", "bf16")
    assert got(RuntimeConfig(device="cpu")) == ("cpu", "fp32")
    assert got(RuntimeConfig(precision="fp32")) == ("cuda", "fp32")


def test_cuda_without_a_gpu_names_the_field(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeUnavailable, match="torch sees no CUDA device") as e:
        resolve_runtime(RuntimeConfig(device="cuda"))
    assert e.value.field == "runtime.device"


def test_a_stage_precision_wins_over_the_runtime():
    rt = Runtime(device="cuda", precision="bf16")
    assert rt.precision_for("auto") == "bf16" and rt.precision_for("fp32") == "fp32"
    assert rt.params() == {"runtime.device": "cuda", "runtime.precision": "bf16", "runtime.mamba_kernels": "none (cpu)"}


def test_the_mamba_kernels_are_the_ones_that_import(monkeypatch):
    import stagewise.model.mamba_kernels as kernels
    from stagewise.model.runtime import mamba_kernels

    assert mamba_kernels("cpu") == "none (cpu)"
    monkeypatch.setattr(kernels, "kernel", lambda name: None)  # nothing imports
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    described = resolve_runtime(RuntimeConfig()).mamba_kernels
    assert described.startswith("mamba2_chunk_scan: ours (mamba-ssm not installed)")
    assert "causal_conv1d_fn: ours (causal-conv1d not installed)" in described
