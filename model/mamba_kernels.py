"""The Mamba-2 GPU kernels NemotronH's mixer can take, found by importing them rather than by name.

Why: transformers resolves its three Mamba-2 functions when its NemotronH module is imported, by
importing `mamba_ssm` and `causal_conv1d`; where an import fails it keeps its PyTorch reference
without a word, and that reference refuses `seq_idx` (packed rows). mamba-ssm built without its
CUDA extension (`MAMBA_SKIP_CUDA_BUILD=TRUE`: how it installs where nvcc or a CUDA torch of the
right version is missing, and what benchmarks/gpu_check.sh carries to a bare GPU machine) is such
a case: its `__init__` imports the Mamba-1 extension `selective_scan_cuda`, which NemotronH never
calls, while the SSD scan it does call is Triton code, plain Python. So the kernels are found here:

- `mamba2_chunk_scan`: mamba-ssm's `mamba_chunk_scan_combined` (Triton). When the one thing
  missing is the Mamba-1 extension, an empty `selective_scan_cuda` module stands in for it in
  `sys.modules` so the package imports (nothing of ours calls the Mamba-1 scan);
- `causal_conv1d_fn`: causal-conv1d's `causal_conv1d_fn` (its CUDA extension; no stand-in);
- `mamba2_split_conv1d_scan_combined` (training's fused conv + scan + norm + projection):
  mamba-ssm's, which calls causal-conv1d's extension, so only where both import.

`kernel(name)` is the kernel, or None where it does not import (model/mamba_torch.py then runs
ours); `describe()` says which run, for the runtime's `mamba_kernels` parameter and the GPU check's
table. Lookups happen once per process, on the first CUDA tensor, never on a CPU run. `disable()`
makes every lookup None: the GPU check's "our PyTorch scan" column.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from importlib.metadata import PackageNotFoundError, version
from typing import Callable

KERNELS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # transformers' name -> (module, function, the distributions it needs)
    "mamba2_chunk_scan": ("mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined", ("mamba-ssm",)),
    "causal_conv1d_fn": ("causal_conv1d", "causal_conv1d_fn", ("causal-conv1d",)),
    "mamba2_split_conv1d_scan_combined": ("mamba_ssm.ops.triton.ssd_combined", "mamba_split_conv1d_scan_combined",
                                          ("mamba-ssm", "causal-conv1d")),
}

_found: dict[str, Callable | None] = {}
_why: dict[str, str] = {}
_disabled = False


def disable(off: bool = True) -> None:
    """Run ours even on CUDA (True), or look the kernels up again (False)."""
    global _disabled
    _disabled = off
    _found.clear()
    _why.clear()


def _stand_in_for_mamba1_extension() -> bool:
    """An empty `selective_scan_cuda` when mamba-ssm is installed but its Mamba-1 extension is not."""
    if "selective_scan_cuda" in sys.modules or importlib.util.find_spec("mamba_ssm") is None:
        return False
    if importlib.util.find_spec("selective_scan_cuda") is not None:
        return False
    sys.modules["selective_scan_cuda"] = types.ModuleType("selective_scan_cuda")
    return True


def _import(module: str, function: str) -> Callable:
    if module.startswith("mamba_ssm"):
        _stand_in_for_mamba1_extension()
    return getattr(importlib.import_module(module), function)


def kernel(name: str) -> Callable | None:
    """The kernel for transformers' function `name`, called with only the keywords it takes; None
    where it does not import (the reason is kept for `describe`)."""
    if _disabled:
        return None
    if name not in _found:
        module, function, _ = KERNELS[name]
        try:
            found = _import(module, function)
            if name == "mamba2_split_conv1d_scan_combined" and kernel("causal_conv1d_fn") is None:
                raise ImportError("it calls causal-conv1d's extension, which does not import")
        except Exception as err:  # an ImportError mostly; a broken build may raise anything at import
            _found[name], _why[name] = None, f"{err.__class__.__name__}: {err}"
        else:
            _found[name] = _only_its_keywords(found)
    return _found[name]


def _only_its_keywords(fn: Callable) -> Callable:
    """`fn` dropping keywords it has no parameter for (transformers passes the mixer's keywords on,
    as its own wrapper around the kernels drops them)."""
    params = set(inspect.signature(fn).parameters)

    def call(*args, **kwargs):
        return fn(*args, **{k: v for k, v in kwargs.items() if k in params})

    call.kernel = fn
    return call


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def describe(device: str) -> str:
    """What the Mamba-2 layers of a run on `device` use: per function the kernel or ours, with the
    distributions' versions and why an installed one does not import (imports the kernels on
    CUDA, nothing on CPU)."""
    if device != "cuda":
        return "none (cpu)"
    if _disabled:
        return "none: disabled (our PyTorch scan and conv)"
    parts = []
    for name in ("mamba2_chunk_scan", "causal_conv1d_fn"):  # the fused path follows these two
        dist = KERNELS[name][2][0]
        have = _installed(dist)
        if kernel(name) is not None:
            parts.append(f"{dist} {have}")
        elif have is None:
            parts.append(f"{name}: ours ({dist} not installed)")
        else:
            parts.append(f"{name}: ours ({dist} {have} does not import: {_why.get(name, '')[:120]})")
    return "; ".join(parts)
