"""Model FLOPs utilisation: how much of the hardware's peak a training run uses.

    MFU = flops_per_token * tokens_per_s / peak_flops

flops_per_token = 6 * N_active + 12 * L_attn * H * d_head * T   (PaLM, appendix B)
- N_active: parameters one token passes through, without the input embedding (a lookup,
  not a matmul) but with lm_head; routed experts count top_k / n_experts of their weights
  (the shared expert and the router count fully). 6 = 2 (multiply-add) x 3 (forward +
  backward for activations and weights).
- The attention term counts QK^T and AV for the L_attn attention layers over the sequence
  length T, without halving for the causal mask (the PaLM convention). Mamba-2's scan is
  not counted (it is small next to its projections, and it is not matmul work on CPU).
- peak_flops: the dense bf16 tensor-core peak from a table for known GPUs (fp32 runs use
  half of it: TF32); on the CPU (and on an unknown GPU) a matmul is timed once per process
  and the best rate is the peak, so CPU MFU says "of what this machine's matmul reaches".
"""

from __future__ import annotations

import time

import torch
from torch import nn

# Dense (no sparsity) bf16 peaks in FLOP/s from the vendors' data sheets; first match wins.
GPU_PEAK_BF16 = [
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H100 PCIe", 756e12),
    ("H200", 989e12),
    ("GH200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
]

_measured: dict[tuple[str, torch.dtype], float] = {}


def active_params(model: nn.Module) -> int:
    """Parameters used per token: no input embeddings; routed experts scaled by top_k/E."""
    cfg = getattr(model, "config", None)
    top_k = getattr(cfg, "num_experts_per_tok", None)
    embedding = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters(False)}
    expert_share: dict[int, float] = {}
    for m in model.modules():
        n_exp = getattr(m, "num_experts", None)
        if type(m).__name__.endswith("Experts") and n_exp and top_k:
            for p in m.parameters(recurse=False):
                expert_share[id(p)] = min(1.0, top_k / n_exp)
    total = 0.0
    for p in model.parameters():
        if id(p) not in embedding:
            total += p.numel() * expert_share.get(id(p), 1.0)
    return int(total)


def attention_dims(model: nn.Module) -> tuple[int, int]:
    """(number of attention layers, heads x head_dim) of a NemotronH config."""
    cfg = getattr(model, "config", None)
    kinds = list(getattr(cfg, "layers_block_type", None) or [])
    n_attn = sum(1 for k in kinds if k in ("full_attention", "attention"))
    heads = getattr(cfg, "num_attention_heads", 0) or 0
    head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else 0)
    return n_attn, heads * head_dim


def flops_per_token(model: nn.Module, seq_length: int) -> float:
    """Training FLOPs (forward + backward) per token, as in the module docstring."""
    n_attn, width = attention_dims(model)
    return 6.0 * active_params(model) + 12.0 * n_attn * width * seq_length


def _time_matmul(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 1):  # the first is a warmup
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def measured_peak(device: torch.device, dtype: torch.dtype) -> float:
    """Best matmul FLOP/s on this device and dtype, measured once per process."""
    key = (str(device), dtype)
    if key not in _measured:
        n = 4096 if device.type == "cuda" else 1024
        with torch.random.fork_rng(devices=[]):  # never disturb the training RNG
            _measured[key] = _time_matmul(device, dtype, n, reps=5)
    return _measured[key]


def peak_flops(device: torch.device | str, dtype: torch.dtype) -> float:
    """Peak FLOP/s for MFU on `device` computing in `dtype` (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_PEAK_BF16:
            if key in name:
                return peak if dtype in (torch.bfloat16, torch.float16) else peak / 2
    return measured_peak(device, dtype)
