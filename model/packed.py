"""Packed forward passes of NemotronH: several documents in one row, each as if it were alone.

Why: packing whole conversations into fixed rows (data/packing.py) only trains the right
thing if nothing flows between them. Per layer type:

- attention: transformers' `create_causal_mask` detects packed rows from `position_ids`
  that restart at 0 and builds the block-diagonal causal mask itself, for every attention
  backend (checked in transformers 5.24 masking_utils.find_packed_sequence_indices);
- MLP / MoE / norms / embeddings: per token, nothing to do;
- Mamba-2: the depthwise causal conv1d and the SSM scan both carry context forward, and
  transformers' PyTorch path has no packed mode (it raises when given `seq_idx`). On GPU
  with mamba-ssm and causal-conv1d installed, `seq_idx` is handed to their kernels (the
  model forwards it to the mixers). Otherwise, for the span of the call, every Mamba mixer
  runs `packed_mixer_forward` below: the conv only sums taps from the same document, and
  the chunked SSD scan (Dao & Gu 2024, the same algorithm as transformers' torch_forward)
  masks every term that would carry state across a boundary:
    * within a chunk, L[l, s] is zeroed unless seq[l] == seq[s];
    * a chunk's end state sums only tokens of the chunk's last document;
    * the inter-chunk recurrence passes a state from chunk end j to chunk end i only if
      both ends lie in the same document (seq_idx never decreases along a row, so equal
      ids mean no boundary in between);
    * a token reads its chunk's start state only if it belongs to that state's document.
  That is exact (not an approximation by a large negative decay), so the packed output
  equals the per-document output up to float rounding (tests/model/test_packed.py).

`packed_forward(model, input_ids, position_ids, seq_idx)` returns logits;
`packed_hidden(...)` the final hidden states (what objectives and MTP heads use).
Works for NemotronHForCausalLM and for a peft-wrapped one.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from transformers.models.nemotron_h.modeling_nemotron_h import (
    NemotronHMamba2Mixer,
    pad_tensor_by_size,
    reshape_into_chunks,
    segment_sum,
)


def kernels_available(device: torch.device) -> bool:
    """True on CUDA with mamba-ssm and causal-conv1d importable (they take seq_idx natively)."""
    return device.type == "cuda" and all(importlib.util.find_spec(m) is not None for m in ("mamba_ssm", "causal_conv1d"))


def position_ids_from_seq_idx(seq_idx: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at every change of seq_idx ([B, T] -> [B, T] int64)."""
    t = torch.arange(seq_idx.shape[1], device=seq_idx.device).expand_as(seq_idx)
    start = torch.ones_like(seq_idx, dtype=torch.bool)
    start[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    first = torch.where(start, t, torch.zeros_like(t)).cummax(dim=1).values
    return (t - first).long()


def cu_seqlens(seq_idx: torch.Tensor) -> torch.Tensor:
    """Cumulative document lengths over the flattened batch (int32, starts at 0): varlen kernels' format."""
    per_row = seq_idx.amax(dim=1, keepdim=True) + 1
    flat = (seq_idx + per_row.cumsum(0) - per_row).reshape(-1)  # ids made distinct across rows
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1]
    idx = torch.nonzero(starts).flatten()
    return torch.cat([idx, idx.new_tensor([flat.numel()])]).to(torch.int32)


def packed_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv over [B, C, T] that never reads a tap from another document.

    out[t] = bias + sum_d weight[:, K-1-d] * x[t-d] * [seq[t-d] == seq[t]] (zero before the row
    start, as the zero padding of the unpacked conv)."""
    k = weight.shape[-1]
    x = x.to(weight.dtype)
    out = x * weight[:, k - 1, None]
    for d in range(1, k):
        if d >= x.shape[-1]:
            break
        same = torch.zeros_like(seq_idx, dtype=torch.bool)
        same[:, d:] = seq_idx[:, d:] == seq_idx[:, :-d]
        shifted = F.pad(x, (d, 0))[..., : x.shape[-1]]
        out = out + shifted * weight[:, k - 1 - d, None] * same[:, None, :]
    return out if bias is None else out + bias[:, None]


def _chunked_seq(seq_idx: torch.Tensor, pad: int, chunk: int) -> torch.Tensor:
    """seq_idx [B, T] padded with its last value to a chunk multiple, as [B, c, l]."""
    if pad:
        seq_idx = torch.cat([seq_idx, seq_idx[:, -1:].expand(-1, pad)], dim=1)
    return seq_idx.reshape(seq_idx.shape[0], -1, chunk)


def packed_chunk_scan(x, dt, A, B, C, chunk_size, D, dt_bias, dt_limit, seq_idx):
    """SSD chunked scan with document resets; same arguments and result as transformers'
    `mamba2_chunk_scan(..., dt_softplus=True)` plus seq_idx [B, T]. See the module docstring."""
    bsz, seq_len, heads, _ = x.shape
    dt = torch.clamp(F.softplus(dt + dt_bias.to(dt.dtype)), min=dt_limit[0], max=dt_limit[1])
    x = x.float()
    B = B.float().repeat_interleave(heads // B.shape[2], dim=2, output_size=heads)
    C = C.float().repeat_interleave(heads // C.shape[2], dim=2, output_size=heads)
    pad = (chunk_size - seq_len % chunk_size) % chunk_size
    d_residual = D[..., None] * pad_tensor_by_size(x, pad)
    x = x * dt[..., None].float()
    A = A.to(x.dtype) * dt.float()
    x, A, B, C = [reshape_into_chunks(t, pad, chunk_size) for t in (x, A, B, C)]
    seq = _chunked_seq(seq_idx, pad, chunk_size)  # b c l

    A = A.permute(0, 3, 1, 2)  # b h c l
    A_cumsum = torch.cumsum(A, dim=-1)
    # 1. within chunks: the attention-like diagonal blocks, masked to same-document pairs
    same = (seq[..., :, None] == seq[..., None, :])[:, None]  # b 1 c l s
    L = torch.exp(segment_sum(A)) * same
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    Y_diag = torch.einsum("bclsh,bcshp->bclhp", G * L.permute(0, 2, 3, 4, 1), x)
    # 2. each chunk's end state, from the tokens of the chunk's last document only
    last = seq[:, :, -1]  # b c
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum) * (seq == last[..., None])[:, None]
    B_decay = B * decay_states.permute(0, 2, 3, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B_decay, x)
    # 3. inter-chunk recurrence, passing a state on only within one document
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    ends = torch.cat([seq[:, :1, 0], last], dim=1)  # document owning each state (initial: the first)
    keep = (ends[:, :, None] == ends[:, None, :])[:, None]  # b 1 i j
    decay_chunk = (torch.exp(segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))) * keep).transpose(1, 3)
    states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)[:, :-1]
    # 4. chunk start state -> output, for the tokens of that state's document
    owner = (seq == ends[:, :-1, None])[:, None]  # b 1 c l
    state_decay_out = torch.exp(A_cumsum) * owner
    Y_off = torch.einsum("bclhn,bchpn->bclhp", C, states) * state_decay_out.permute(0, 2, 3, 1)[..., None]

    y = (Y_diag + Y_off).reshape(bsz, -1, heads, x.shape[-1]) + d_residual
    return y[:, :seq_len]


def packed_mixer_forward(mixer: NemotronHMamba2Mixer, hidden_states: torch.Tensor, seq_idx: torch.Tensor) -> torch.Tensor:
    """NemotronHMamba2Mixer's PyTorch forward (no cache) with document boundaries respected."""
    bsz, seq_len, _ = hidden_states.shape
    dtype = hidden_states.dtype
    projected = mixer.in_proj(hidden_states)
    gate, xbc, dt = projected.split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
    xbc = packed_conv1d(xbc.transpose(1, 2), mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias, seq_idx)
    xbc = mixer.act(xbc).to(dtype).transpose(1, 2)
    groups_state = mixer.n_groups * mixer.ssm_state_size
    x, B, C = torch.split(xbc, [mixer.intermediate_size, groups_state, groups_state], dim=-1)
    y = packed_chunk_scan(
        x.view(bsz, seq_len, mixer.num_heads, mixer.head_dim), dt, -torch.exp(mixer.A_log.float()),
        B.view(bsz, seq_len, mixer.n_groups, mixer.ssm_state_size),
        C.view(bsz, seq_len, mixer.n_groups, mixer.ssm_state_size),
        mixer.chunk_size, mixer.D, mixer.dt_bias, mixer.time_step_limit, seq_idx,
    )
    y = mixer.norm(y.reshape(bsz, seq_len, -1), gate)
    return mixer.out_proj(y.to(dtype))


@contextlib.contextmanager
def packed_mamba(module: torch.nn.Module, seq_idx: torch.Tensor) -> Iterator[None]:
    """While open, every Mamba mixer in `module` runs packed_mixer_forward with this seq_idx."""
    mixers = [m for m in module.modules() if isinstance(m, NemotronHMamba2Mixer)]
    saved = [m.__dict__.get("forward") for m in mixers]

    def patched(mixer):
        def forward(hidden_states, cache=None, attention_mask=None, **kwargs):
            if cache is not None:
                raise ValueError("packed forward does not support a cache (training-only path)")
            return packed_mixer_forward(mixer, hidden_states, seq_idx)
        return forward

    try:
        for m in mixers:
            m.forward = patched(m)
        yield
    finally:
        for m, old in zip(mixers, saved):
            if old is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = old


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The NemotronHForCausalLM inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def packed_hidden(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor | None,
                  seq_idx: torch.Tensor, use_kernels: bool | None = None) -> torch.Tensor:
    """Final hidden states [B, T, H] of a packed batch (see the module docstring).

    position_ids must restart at 0 where seq_idx changes (None: derived from seq_idx)."""
    lm = causal_lm(model)
    if position_ids is None:
        position_ids = position_ids_from_seq_idx(seq_idx)
    elif input_ids.device.type == "cpu" and not torch.equal(position_ids, position_ids_from_seq_idx(seq_idx)):
        raise ValueError("position_ids must restart at 0 exactly where seq_idx changes")
    seq_idx = seq_idx.to(torch.int32)
    if use_kernels is None:
        use_kernels = kernels_available(input_ids.device)
    if use_kernels:  # transformers forwards seq_idx to mamba-ssm / causal-conv1d
        return lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, seq_idx=seq_idx).last_hidden_state
    with packed_mamba(lm.model, seq_idx):
        return lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state


def packed_forward(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor | None,
                   seq_idx: torch.Tensor, use_kernels: bool | None = None) -> torch.Tensor:
    """Logits [B, T, V] (fp32) of a packed batch, every document isolated."""
    hidden = packed_hidden(model, input_ids, position_ids, seq_idx, use_kernels)
    return causal_lm(model).lm_head(hidden).float()
