"""NVFP4 fake quantization in plain PyTorch, so NVFP4 runs on CPU.

modelopt 0.47 fake-quantizes NVFP4 with a CUDA/Triton kernel: once a dynamic NVFP4 quantizer
is calibrated, every forward on CPU fails with "amax must be a CUDA tensor for dynamic block
quantization". This module emulates the same rule (docs/ALGORITHMS.md §8) with tensor ops and
plugs it into modelopt as a custom quantization backend, so `mtq.quantize` with an NVFP4
config works on the CPU demo; on a GPU, leave the config alone and modelopt's kernel runs.

The rule, per tensor x with absolute max `amax` (or the quantizer's calibrated amax):
  s2 = amax / (6 * 448)                                      FP32 tensor scale
  sb = fp8_e4m3(clamp(amax_block / (6 * s2), 2**-9, 448))    per block of 16 (0 -> 1.0)
  q  = round-half-even of x / (sb * s2) onto E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating
  fake-quantized x = q * sb * s2, in x's dtype.
It is bit-exact with modelopt's pure-torch reference (NVFP4QTensor.quantize + dequantize).

    from stagewise.quant.nvfp4_emulation import with_cpu_backend
    mtq.quantize(model, with_cpu_backend(mtq.NVFP4_DEFAULT_CFG), forward_loop)
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

BACKEND = "stagewise_nvfp4_cpu"

E2M1_MAX = 6.0
E4M3_MAX = 448.0
# Magnitudes of E2M1 and the midpoints between neighbours. An even index has an even mantissa
# bit, so round-half-to-even means: at an exact midpoint, take the neighbour with even index.
_E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def _round_to_e2m1(v: torch.Tensor) -> torch.Tensor:
    """FP32 values rounded half-to-even onto the signed E2M1 grid, saturating at ±6."""
    a = v.abs()
    bounds = _E2M1_MIDPOINTS.to(a.device)
    lo = torch.bucketize(a, bounds, right=False)  # at a midpoint: the lower neighbour
    hi = torch.bucketize(a, bounds, right=True)  # at a midpoint: the upper one; else == lo
    idx = torch.where(lo % 2 == 0, lo, hi)
    mag = _E2M1_GRID.to(a.device)[idx]
    return torch.where(v < 0, -mag, mag)


def _block_scales(blocks: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """Per-block FP8 E4M3 scale (as FP32) of `blocks` [..., n_blocks, block] given s2."""
    sb = blocks.abs().amax(dim=-1).float() / (E2M1_MAX * s2)
    sb = torch.where(sb == 0, torch.ones_like(sb), sb)
    return sb.clamp(min=2**-9, max=E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def _fake_quant(x: torch.Tensor, amax: torch.Tensor | None, block_size: int) -> torch.Tensor:
    """The NVFP4 rule of the module docstring, without autograd."""
    n = x.shape[-1]
    pad = -n % block_size
    xp = F.pad(x, (0, pad)) if pad else x  # zero padding leaves every block's amax unchanged
    amax = xp.abs().amax() if amax is None else amax.detach().to(xp.device).amax()
    s2 = amax.float() / (E2M1_MAX * E4M3_MAX)
    s2 = torch.where(s2 == 0, 1.0, s2)  # an all-zero tensor: any scale gives zeros; avoid 0/0
    blocks = xp.reshape(*xp.shape[:-1], -1, block_size)
    scale = (_block_scales(blocks, s2) * s2).unsqueeze(-1)
    q = _round_to_e2m1(blocks / scale)
    out = (q * scale).reshape(xp.shape).to(x.dtype)
    return out[..., :n] if pad else out


class _StraightThrough(torch.autograd.Function):
    """Fake quantization forward, identity backward (modelopt's pass-through for NVFP4)."""

    @staticmethod
    def forward(ctx, x, amax, block_size):
        return _fake_quant(x, amax, block_size)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def fake_quant_nvfp4(x: torch.Tensor, amax: torch.Tensor | None = None, block_size: int = 16) -> torch.Tensor:
    """x fake-quantized to NVFP4 along its last dimension (padded to a multiple of `block_size`
    and cut back). `amax` (a calibrated absolute max; reduced to its max if not a scalar) sets
    the tensor scale; by default x's own absolute max does. Gradients pass straight through."""
    return _StraightThrough.apply(x, amax, block_size)


def _entrypoint(inputs: torch.Tensor, quantizer) -> torch.Tensor:
    """modelopt backend hook: fake-quantize `inputs` with the quantizer's amax and block size."""
    sizes = quantizer.block_sizes or {}
    block_size = sizes.get(-1) or sizes.get(inputs.dim() - 1) or 16
    return fake_quant_nvfp4(inputs, quantizer.amax, block_size)


def register_cpu_backend() -> None:
    """Register this emulation with modelopt under BACKEND (a no-op when already registered).

    Call it before restoring a model quantized with BACKEND in a new process: modelopt keeps
    only the backend's name in the model's state."""
    from modelopt.torch.quantization.nn.modules.tensor_quantizer import (  # noqa: PLC0415 (nvidia-modelopt: 7 s to import, only where a model is quantized)
        is_registered_quant_backend,
        register_quant_backend,
    )

    if not is_registered_quant_backend(BACKEND):
        register_quant_backend(BACKEND, _entrypoint)


def _is_fp4(attrs) -> bool:
    """Whether a quantizer attribute dict asks for E2M1 (num_bits (2, 1), tuple or list)."""
    bits = attrs.get("num_bits") if isinstance(attrs, dict) else None
    return isinstance(bits, (tuple, list)) and tuple(bits) == (2, 1)


def _check_emulable(name: str, attrs: dict) -> None:
    """ValueError unless an E2M1 entry is dynamic NVFP4 (FP8 E4M3 block scales), the one
    variant emulated here: MXFP4 (E8M0 scales), static per-block amax (MSE-searched scales)
    and 4-over-6 would silently get the wrong numbers."""
    sizes = attrs.get("block_sizes") or {}
    scale_bits = sizes.get("scale_bits")
    if (sizes.get("type") != "dynamic" or not isinstance(scale_bits, (tuple, list))
            or tuple(scale_bits) != (4, 3) or sizes.get("four_over_six")):
        raise ValueError(f"quant_cfg {name!r}: E2M1 with block_sizes {sizes} is not dynamic NVFP4; "
                         "the CPU emulation covers only type 'dynamic', scale_bits (4, 3)")


def with_cpu_backend(cfg: dict) -> dict:
    """A deep copy of modelopt quant config `cfg` whose NVFP4 (num_bits (2, 1)) quantizers use
    this CPU emulation; registers the backend so the copy is ready for `mtq.quantize`.

    The other attributes (block_sizes, effective_bits, ...) stay: modelopt skips its num_bits
    check when a backend is set, still calibrates amax with them, and hands the quantizer
    (amax, block_sizes) to the backend on every forward; `backend_extra_args` is not needed.
    An E2M1 entry that is not dynamic NVFP4 raises ValueError (see _check_emulable)."""
    out = copy.deepcopy(cfg)
    for entry in out.get("quant_cfg", []):
        attrs = entry.get("cfg") if isinstance(entry, dict) else None
        for a in attrs if isinstance(attrs, list) else [attrs]:
            if _is_fp4(a):
                _check_emulable(entry.get("quantizer_name", "?"), a)
                a["backend"] = BACKEND
    register_cpu_backend()
    return out
