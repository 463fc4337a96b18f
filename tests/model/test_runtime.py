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


def test_the_mamba_kernels_are_named_from_the_installed_distributions(monkeypatch):
    import importlib.metadata as md

    import stagewise.model.runtime as runtime_module
    from stagewise.model.runtime import mamba_kernels

    assert mamba_kernels("cpu") == "none (cpu)"
    installed = {"mamba-ssm": "2.2.4", "causal-conv1d": "1.5.0"}

    def version(dist):
        if dist not in installed:
            raise md.PackageNotFoundError(dist)
        return installed[dist]

    monkeypatch.setattr(runtime_module, "version", version)
    assert mamba_kernels("cuda") == "mamba-ssm 2.2.4 + causal-conv1d 1.5.0"
    del installed["causal-conv1d"]
    assert mamba_kernels("cuda").startswith("none: causal-conv1d not installed (PyTorch path")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert "causal-conv1d not installed" in resolve_runtime(RuntimeConfig()).mamba_kernels
