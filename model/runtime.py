"""Where and in what precision a recipe trains and evaluates: the recipe's `runtime:` block.

One choice for the whole run, made once before any work starts and handed to every stage
(and to `stagewise eval`): `auto` takes CUDA with bf16 autocast when a GPU is present and
plain fp32 on CPU (CPU autocast is slower than fp32 for small models). Asking for `cuda` on a
machine without one is bad input, found before training rather than at the first tensor.

On CUDA the Mamba-2 layers run mamba-ssm's and causal-conv1d's kernels where they import
(model/mamba_kernels.py finds them; model/packed.py hands packed rows' boundaries to them as
`seq_idx`), otherwise our PyTorch functions (model/mamba_torch.py). Which ones a run gets is
found here, once (importing the kernels on CUDA only), and logged with the runtime
(`runtime.mamba_kernels`), so a slow GPU run that silently fell back is visible in MLflow.

A stage's own `precision` wins over the runtime's when it is not `auto`. The device is kept
out of step hashes (a checkpoint trained on a GPU is reused on a CPU rerun); the precision is
in them through the stage's resolved train config.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from stagewise.config_base import StrictConfig
from stagewise.model.mamba_kernels import describe


class RuntimeConfig(StrictConfig):
    """The recipe's `runtime:` block."""


    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: cuda when torch sees a GPU, else cpu. cuda on a machine without one exits 2."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto: bf16 autocast on a CUDA device that supports it, fp32 otherwise."""


class Runtime(BaseModel):
    """A resolved runtime: a concrete device and precision (logged as run params)."""

    model_config = ConfigDict(frozen=True)

    device: Literal["cpu", "cuda"] = "cpu"
    precision: Literal["fp32", "bf16"] = "fp32"
    mamba_kernels: str = "none (cpu)"
    """What Mamba-2 layers run: `mamba-ssm <v> + causal-conv1d <v>`, or why the PyTorch path."""

    def params(self) -> dict[str, str]:
        """As MLflow params."""
        return {"runtime.device": self.device, "runtime.precision": self.precision,
                "runtime.mamba_kernels": self.mamba_kernels}

    def precision_for(self, stage_precision: str) -> str:
        """A stage's precision: its own when set, else the runtime's."""
        return self.precision if stage_precision == "auto" else stage_precision


class RuntimeUnavailable(ValueError):
    """The runtime asked for cannot be had on this machine (`field` names the recipe key)."""

    def __init__(self, field: str, why: str):
        self.field = field
        super().__init__(why)


def resolve_runtime(cfg: RuntimeConfig) -> Runtime:
    """The concrete device and precision for `cfg` on this machine."""
    has_cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not has_cuda:
        raise RuntimeUnavailable("runtime.device", "cuda was asked for but torch sees no CUDA device on this "
                                 f"machine (torch {torch.__version__}); use auto or cpu")
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and has_cuda) else "cpu"
    bf16_ok = device == "cuda" and torch.cuda.is_bf16_supported()
    if cfg.precision == "bf16" and device == "cuda" and not bf16_ok:
        raise RuntimeUnavailable("runtime.precision", "bf16 was asked for but this CUDA device does not support it")
    precision = "bf16" if cfg.precision == "bf16" or (cfg.precision == "auto" and bf16_ok) else "fp32"
    return Runtime(device=device, precision=precision, mamba_kernels=mamba_kernels(device))


def mamba_kernels(device: str) -> str:
    """The Mamba-2 kernels a run on `device` uses: the ones that import (model/mamba_kernels.py)."""
    return describe(device)
