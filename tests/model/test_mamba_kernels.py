"""model/mamba_kernels.py: the kernels are the ones that import, and mamba-ssm built without its
CUDA extension still gives its Triton SSD scan.

The packages here are stand-ins laid out as mamba-ssm 2.3's files are (its `__init__` imports the
Mamba-1 extension `selective_scan_cuda`; the scan lives in ops/triton/ssd_combined.py): the real
one needs Triton on a GPU (benchmarks/gpu_check.sh runs it there)."""

from __future__ import annotations

import sys

import pytest

from stagewise.model import mamba_kernels


def _package(root, name: str, version: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")


MAMBA = {
    "__init__.py": "import selective_scan_cuda\n",
    "ops/__init__.py": "", "ops/triton/__init__.py": "",
    "ops/triton/ssd_combined.py": (
        "def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, seq_idx=None):\n"
        "    return ('triton scan', seq_idx)\n"
        "def mamba_split_conv1d_scan_combined(zxbcdt, *a, seq_idx=None, **k):\n"
        "    return 'fused'\n"),
}


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A clean lookup, with tmp_path first on sys.path and no stand-in left behind."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] in ("mamba_ssm", "causal_conv1d", "selective_scan_cuda")]:
        monkeypatch.delitem(sys.modules, name)
    mamba_kernels.disable(False)
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] in ("mamba_ssm", "causal_conv1d", "selective_scan_cuda")]:
        del sys.modules[name]
    mamba_kernels.disable(False)


def test_nothing_installed_means_ours_everywhere(fresh):
    assert all(mamba_kernels.kernel(name) is None for name in mamba_kernels.KERNELS)
    assert mamba_kernels.describe("cpu") == "none (cpu)"
    assert mamba_kernels.describe("cuda") == ("mamba2_chunk_scan: ours (mamba-ssm not installed); "
                                              "causal_conv1d_fn: ours (causal-conv1d not installed)")


def test_mamba_ssm_without_its_cuda_extension_still_gives_the_triton_scan(fresh):
    _package(fresh, "mamba_ssm", "2.3.2", MAMBA)
    scan = mamba_kernels.kernel("mamba2_chunk_scan")
    assert scan is not None
    # the mixer's other keywords are dropped, seq_idx goes through
    assert scan("x", "dt", "A", "B", "C", 128, D=None, seq_idx="ids", dt_softplus=True) == ("triton scan", "ids")
    assert isinstance(sys.modules["selective_scan_cuda"], type(sys))  # the empty stand-in
    # no causal-conv1d: the conv is ours, and so the fused path (it calls causal-conv1d's extension)
    assert mamba_kernels.kernel("causal_conv1d_fn") is None
    assert mamba_kernels.kernel("mamba2_split_conv1d_scan_combined") is None
    assert mamba_kernels.describe("cuda") == "mamba-ssm 2.3.2; causal_conv1d_fn: ours (causal-conv1d not installed)"


def test_with_both_the_fused_training_kernel_is_taken_and_disable_turns_all_off(fresh):
    _package(fresh, "mamba_ssm", "2.3.2", MAMBA)
    _package(fresh, "causal_conv1d", "1.5.0", {"__init__.py": "def causal_conv1d_fn(x, weight, bias=None, seq_idx=None,"
                                                                  " activation=None):\n    return 'conv'\n"})
    assert mamba_kernels.kernel("mamba2_split_conv1d_scan_combined")("zxbcdt", seq_idx=None) == "fused"
    assert mamba_kernels.describe("cuda") == "mamba-ssm 2.3.2; causal-conv1d 1.5.0"
    mamba_kernels.disable()
    assert all(mamba_kernels.kernel(name) is None for name in mamba_kernels.KERNELS)
    assert mamba_kernels.describe("cuda") == "none: disabled (our PyTorch scan and conv)"


def test_a_broken_conv_extension_is_ours_with_the_reason(fresh):
    _package(fresh, "causal_conv1d", "1.5.0", {"__init__.py": "import causal_conv1d_cuda\n"})
    assert mamba_kernels.kernel("causal_conv1d_fn") is None
    assert "causal_conv1d_cuda" in mamba_kernels._why["causal_conv1d_fn"]
    assert mamba_kernels.describe("cuda").endswith(
        "causal_conv1d_fn: ours (causal-conv1d 1.5.0 does not import: "
        "ModuleNotFoundError: No module named 'causal_conv1d_cuda')")
