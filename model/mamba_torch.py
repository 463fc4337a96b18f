"""Our PyTorch Mamba-2 functions, put in place of transformers' reference ones where no kernel runs.

transformers' NemotronH mixer calls two module-level functions that kernels may replace:
`mamba2_chunk_scan` (mamba-ssm's mamba_chunk_scan_combined) and `causal_conv1d_fn`
(causal-conv1d's). Without those packages it runs reference PyTorch versions, which

- refuse `seq_idx` ("can't keep packed sequences apart"), so packed rows (data/packing.py) could
  not be trained on without a GPU, and
- lay the SSD scan out for reading, not speed: B and C repeated to every head, the within-chunk
  decay built by an expand-mask-cumsum-mask over [b, h, c, l, l] (whose backward flips and
  cumsums it again), contractions in the (b, c, l, s, h) layout, so each permutes tensors of
  chunk^2 x heads elements. On the demo's CPU the two Mamba layers were half of a training step.

`install()` puts `chunk_scan` and `causal_conv1d` below in their place for every tensor the
kernels would not take (CPU tensors, and CUDA tensors where a kernel does not import:
model/mamba_kernels.py finds them), and the fused training kernel too (`no_fused_path` where it
does not import, so the mixer goes step by step). Both take the reference functions'
arguments plus `seq_idx` [B, T] (a document id per token, non-decreasing along a row) and carry
nothing from one document to the next (up to float rounding); transformers forwards
`seq_idx` from the model call to them, as it does to the kernels. Results equal the reference
functions' to float rounding, gradients included (tests/model/test_mamba_torch.py).

The SSD scan (Dao & Gu 2024, "Transformers are SSMs") stays in (batch, chunk, head, position,
...) order so each contraction is one batched matmul; the within-chunk decay is
exp(cs[i] - cs[j]) below the diagonal (what mamba-ssm's kernels compute), the scores C B^T are
formed once per group of heads (a group shares B and C), and the chunk-to-chunk recurrence is
one small matmul. The terms (dt positive after bias and softplus, cs the cumulative sum of A dt
within the chunk):
  within a chunk:   y[l] += sum_{s<=l} (C[l] . B[s]) exp(cs[l] - cs[s]) dt[s] x[s]
  chunk end state:  S_c = sum_s exp(cs[end] - cs[s]) dt[s] x[s] B[s]^T
  across chunks:    start state of chunk c = sum_{z<=c} exp(cs_end[c-1] - cs_end[z-1]) S_{z-1}
  from the start:   y[l] += exp(cs[l]) C[l] . start state
With seq_idx every term whose two ends lie in different documents is dropped (exactly, not by a
large negative decay): within a chunk, pairs of different documents; a chunk's end state, tokens
not of the chunk's last document; across chunks, states of another document; from the start
state, tokens not of its document.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.nemotron_h import modeling_nemotron_h

from stagewise.model import mamba_kernels


def _chunked(t: torch.Tensor, pad: int, chunk: int) -> torch.Tensor:
    """[b, T, ...] -> [b, c, chunk, ...], zero-padded at the end to a chunk multiple."""
    if pad:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.reshape(t.shape[0], -1, chunk, *t.shape[2:])


def _decay(cs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(cs[..., i] - cs[..., j]) where keep[i, j], else 0.

    The dropped differences are set to -inf before the exp: above the diagonal they are positive
    and their exp may overflow, and inf times a zero mask would give NaN gradients."""
    return torch.exp((cs[..., :, None] - cs[..., None, :]).masked_fill(~keep, float("-inf")))


def chunk_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    seq_idx: torch.Tensor | None = None,
    **_: object,
):
    """x [b, T, h, p], dt [b, T, h], A [h], B and C [b, T, g, n], D [h], dt_bias [h],
    initial_states [b, h, p, n], seq_idx [b, T] (non-decreasing along a row). Returns y [b, T, h, p]
    in float32 (as transformers' path does), and the final state [b, h, p, n] if asked."""
    bsz, seq_len, heads, head_dim = x.shape
    groups, state = B.shape[2], B.shape[3]
    per_group = heads // groups
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = x.float()
    pad = (chunk_size - seq_len % chunk_size) % chunk_size

    # (b, c, h, l, ...) layout: one batched matmul per contraction below.
    xdt = _chunked(x * dt[..., None], pad, chunk_size).permute(0, 1, 3, 2, 4)  # b c h l p
    cs = torch.cumsum(_chunked(A.float() * dt, pad, chunk_size).transpose(2, 3), dim=-1)  # b c h l
    Bc = _chunked(B.float(), pad, chunk_size).permute(0, 1, 3, 2, 4)  # b c g l n
    Cc = _chunked(C.float(), pad, chunk_size).permute(0, 1, 3, 2, 4)  # b c g l n
    chunks = cs.shape[1]

    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    if seq_idx is not None:
        # padded with the last document's id: padding then carries nothing across documents
        seq = torch.cat([seq_idx, seq_idx[:, -1:].expand(-1, pad)], dim=1).reshape(bsz, -1, chunk_size)
        same = seq[..., :, None] == seq[..., None, :]  # b c l s
        keep_diag = (causal & same)[:, :, None]  # b c 1 l s
        last = seq[:, :, -1]  # b c: the document a chunk's end state belongs to
    else:
        keep_diag = causal

    # 1. within each chunk: scores per group, decays per head.
    scores = Cc @ Bc.transpose(-1, -2)  # b c g l s
    decay = _decay(cs, keep_diag)  # b c h l s
    weights = (decay.view(bsz, chunks, groups, per_group, chunk_size, chunk_size) * scores[:, :, :, None])
    y = weights.view(bsz, chunks, heads, chunk_size, chunk_size) @ xdt  # b c h l p

    # 2. each chunk's end state (of its last document's tokens only, when packed).
    to_end = torch.exp(cs[..., -1:] - cs)  # b c h l
    if seq_idx is not None:
        to_end = to_end * (seq == last[..., None])[:, :, None]
    Bh = Bc[:, :, :, None].expand(-1, -1, -1, per_group, -1, -1).reshape(bsz, chunks, heads, chunk_size, state)
    ends = (xdt * to_end[..., None]).transpose(-1, -2) @ Bh  # b c h p n

    # 3. chunk to chunk: the start state of every chunk from the end states before it.
    start = (initial_states.to(ends.dtype)[:, None] if initial_states is not None
             else torch.zeros_like(ends[:, :1]))
    ends = torch.cat([start, ends], dim=1)  # b (c+1) h p n
    cs_end = F.pad(cs[..., -1], (0, 0, 1, 0)).cumsum(1).transpose(1, 2)  # b h (c+1): log decay to each chunk end
    keep_chunks = torch.ones(chunks + 1, chunks + 1, dtype=torch.bool, device=x.device).tril()
    if seq_idx is not None:
        owner = torch.cat([seq[:, :1, 0], last], dim=1)  # b (c+1): the document each state belongs to
        keep_chunks = keep_chunks & (owner[:, :, None] == owner[:, None, :])[:, None]
    carry = _decay(cs_end, keep_chunks)  # b h (c+1) (c+1)
    states = (carry @ ends.transpose(1, 2).flatten(-2)).view(bsz, heads, chunks + 1, head_dim, state)
    states = states.transpose(1, 2)  # b (c+1) h p n

    # 4. from each chunk's start state to its tokens.
    from_start = torch.exp(cs)  # b c h l
    if seq_idx is not None:
        from_start = from_start * (seq == owner[:, :-1, None])[:, :, None]
    Ch = Cc[:, :, :, None].expand(-1, -1, -1, per_group, -1, -1).reshape(bsz, chunks, heads, chunk_size, state)
    y = y + (Ch @ states[:, :-1].transpose(-1, -2)) * from_start[..., None]

    y = y.permute(0, 1, 3, 2, 4).reshape(bsz, -1, heads, head_dim)[:, :seq_len]
    if D is not None:
        y = y + D.float()[:, None] * x
    if return_final_states:
        return y, states[:, -1]
    return y


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    seq_idx: torch.Tensor | None = None,
    **_: object,
) -> torch.Tensor:
    """Depthwise causal conv over x [B, C, T] with weight [C, K], then the activation ("silu" or None).

    out[t] = bias + sum_d weight[:, K-1-d] x[t-d], zero before the row start; with seq_idx only
    the taps of the same document count (the others are subtracted again: equal up to float
    rounding; benchmarks/mamba_scan.py: a packed SFT step ~1% slower than unpacked, 9% masking every tap)."""
    k, length, dtype = weight.shape[-1], x.shape[-1], x.dtype
    x = x.to(weight.dtype)
    out = F.conv1d(x, weight.unsqueeze(1), bias, padding=k - 1, groups=x.shape[1])[..., :length]
    if seq_idx is not None:
        # Take back the taps that reached into an earlier document: at most one per document start
        # and lag, so a gather and a scatter-add of those few columns instead of masking every tap
        # everywhere. One lag at a time: no position repeats within a scatter, so the sums (and the
        # gradients' sums) run in a fixed order and training stays bitwise reproducible.
        for lag in range(1, min(k, length)):
            rows, cols = (seq_idx[:, lag:] != seq_idx[:, :-lag]).nonzero(as_tuple=True)
            if len(rows):
                cols = cols + lag
                leaked = x[rows, :, cols - lag] * weight[:, k - 1 - lag]  # [n, C]
                out = out.transpose(1, 2).index_put((rows, cols), -leaked, accumulate=True).transpose(1, 2)
    if activation is not None:
        if activation not in ("silu", "swish"):
            raise ValueError(f"causal_conv1d: activation {activation!r} (silu or None)")
        out = F.silu(out)
    return out.to(dtype)


def _in_place_of(reference, ours, name: str):
    """`ours`, except for CUDA tensors where the kernel for transformers' `name` imports
    (model/mamba_kernels.py): those go to the kernel, seq_idx and all."""

    def dispatch(x, *args, **kwargs):
        if x.is_cuda and (fast := mamba_kernels.kernel(name)) is not None:
            return fast(x, *args, **kwargs)
        return ours(x, *args, **kwargs)

    dispatch.stagewise_reference = reference
    return dispatch


def no_fused_path(*_: object, **__: object) -> None:
    """What the training mixer's fused conv+scan+norm+projection kernel is without mamba-ssm: None, so
    the mixer goes the step-by-step way through the two functions above (transformers' reference
    returns None too, but first refuses seq_idx)."""
    return None


_OURS = {  # transformers' name -> ours
    "mamba2_chunk_scan": chunk_scan,
    "causal_conv1d_fn": causal_conv1d,
    "mamba2_split_conv1d_scan_combined": no_fused_path,
}


def install() -> None:
    """Make transformers' NemotronH use ours (see the module docstring). Process-wide and idempotent:
    every NemotronH model of this process, trained or generating."""
    for name, ours in _OURS.items():
        current = getattr(modeling_nemotron_h, name)
        if not hasattr(current, "stagewise_reference"):
            setattr(modeling_nemotron_h, name, _in_place_of(current, ours, name))
