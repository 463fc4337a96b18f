"""Packed forward passes of NemotronH: several documents in one row, each as if it were alone.

Why: packing whole conversations into fixed rows (data/packing.py) only trains the right
thing if nothing flows between them. Per layer type:

- attention: transformers' `create_causal_mask` detects packed rows from `position_ids`
  that restart at 0 and builds the block-diagonal causal mask itself, for every attention
  backend (checked in transformers 5.24 masking_utils.find_packed_sequence_indices);
- MLP / MoE / norms / embeddings: per token, nothing to do;
- Mamba-2: the depthwise causal conv1d and the SSD scan both carry context forward. The model
  call hands `seq_idx` to the mixers, which pass it to their two functions: mamba-ssm's and
  causal-conv1d's kernels on a GPU that has them, otherwise ours (model/mamba_torch.py, which
  `packed_hidden` installs: transformers' own reference functions refuse `seq_idx`). Either way
  no conv tap and no SSM state crosses a document boundary (the scan drops those terms, not by a
  large negative decay; our conv subtracts the few crossing taps again), so the packed output
  equals the per-document output up to float rounding (tests/model/test_packed.py).

`packed_forward(model, input_ids, position_ids, seq_idx)` returns logits;
`packed_hidden(...)` the final hidden states (what objectives and MTP heads use).
Works for NemotronHForCausalLM and for a peft-wrapped one.
"""

from __future__ import annotations

import torch

from stagewise.model import mamba_torch


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


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The NemotronHForCausalLM inside a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def packed_hidden(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor | None,
                  seq_idx: torch.Tensor) -> torch.Tensor:
    """Final hidden states [B, T, H] of a packed batch (see the module docstring).

    position_ids must restart at 0 where seq_idx changes (None: derived from seq_idx)."""
    lm = causal_lm(model)
    if position_ids is None:
        position_ids = position_ids_from_seq_idx(seq_idx)
    elif input_ids.device.type == "cpu" and not torch.equal(position_ids, position_ids_from_seq_idx(seq_idx)):
        raise ValueError("position_ids must restart at 0 exactly where seq_idx changes")
    mamba_torch.install()
    return lm.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                    seq_idx=seq_idx.to(torch.int32)).last_hidden_state


def packed_forward(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor | None,
                   seq_idx: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] (fp32) of a packed batch, every document isolated."""
    hidden = packed_hidden(model, input_ids, position_ids, seq_idx)
    return causal_lm(model).lm_head(hidden).float()
