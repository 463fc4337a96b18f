"""Packed forward: each document gets the same logits, loss and gradient as when run alone.

The tiny model has Mamba-2, attention, MoE and MLP layers, chunk_size 16: documents start
mid-chunk, span several chunks, and one is a single token, so every masked term of the
packed SSD scan is exercised (the scan and conv alone: tests/model/test_mamba_torch.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stagewise.model.packed import cu_seqlens, packed_forward, position_ids_from_seq_idx

LENGTHS = [5, 23, 40, 1, 9, 17]  # 95 tokens; the row is padded to 100


def packed_batch(lengths, total, seed=0):
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(3, 256, (n,), generator=g) for n in lengths]
    pad = total - sum(lengths)
    ids = torch.cat([*docs, torch.zeros(pad, dtype=torch.long)])[None]
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate([*lengths, pad]) if n])[None]
    return docs, ids, seq


def test_model_has_every_layer_type(model_factory):
    # linear_attention = Mamba-2, full_attention = attention
    assert set(model_factory().config.layers_block_type) == {"linear_attention", "full_attention", "moe", "mlp"}


def test_packed_logits_equal_alone(model_factory):
    model = model_factory(pattern="M*E-M").eval()
    docs, ids, seq = packed_batch(LENGTHS, 100)
    with torch.no_grad():
        packed = packed_forward(model, ids, position_ids_from_seq_idx(seq), seq)
        off = 0
        for doc in docs:
            alone = model(input_ids=doc[None]).logits
            torch.testing.assert_close(packed[:, off:off + len(doc)], alone, atol=1e-4, rtol=1e-4)
            off += len(doc)


def test_packed_loss_and_gradient_equal_alone(model_factory):
    """A conversation's loss (and its gradient) is the same packed with others as alone."""
    torch.manual_seed(0)
    model = model_factory(pattern="M*E-").train()
    docs, ids, seq = packed_batch([30, 19, 35], 96, seed=1)
    target = 1  # the middle document: context on both sides
    start, n = 30, 19
    logits = packed_forward(model, ids, None, seq)
    packed_loss = F.cross_entropy(logits[0, start:start + n - 1], ids[0, start + 1:start + n])
    packed_loss.backward()
    packed_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    alone_logits = model(input_ids=docs[target][None]).logits
    alone_loss = F.cross_entropy(alone_logits[0, :-1], docs[target][1:])
    alone_loss.backward()
    torch.testing.assert_close(packed_loss, alone_loss, atol=1e-4, rtol=1e-4)
    for k, p in model.named_parameters():
        if p.grad is not None and k in packed_grads:
            torch.testing.assert_close(packed_grads[k], p.grad, atol=1e-4, rtol=1e-3, msg=k)


def test_a_single_document_row_matches_the_plain_forward(model_factory):
    model = model_factory().eval()
    ids = torch.randint(3, 256, (2, 48))
    with torch.no_grad():
        torch.testing.assert_close(packed_forward(model, ids, None, torch.zeros_like(ids)),
                                   model(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


def test_the_plain_model_call_with_seq_idx_is_the_packed_forward(model_factory):
    """One mechanism: transformers hands seq_idx to the Mamba functions (ours here, the kernels on a GPU)."""
    model = model_factory().eval()
    _, ids, seq = packed_batch([10, 6], 16)
    with torch.no_grad():
        packed = packed_forward(model, ids, None, seq)
        plain = model(input_ids=ids, position_ids=position_ids_from_seq_idx(seq), seq_idx=seq.int()).logits
    torch.testing.assert_close(plain, packed)
    assert "forward" not in model.model.layers[0].mixer.__dict__  # nothing patched per model


def test_position_ids_must_match_seq_idx(model_factory):
    _, ids, seq = packed_batch([10, 6], 16)
    with pytest.raises(ValueError, match="restart at 0"):
        packed_forward(model_factory(), ids, torch.arange(16)[None], seq)


def test_helpers():
    seq = torch.tensor([[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
    assert position_ids_from_seq_idx(seq).tolist() == [[0, 1, 0, 1, 2, 0], [0, 0, 1, 2, 3, 4]]
    assert cu_seqlens(seq).tolist() == [0, 2, 5, 6, 7, 12]
