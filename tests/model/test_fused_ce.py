"""The chunked output-layer cross-entropy equals the plain one in loss and gradients (objectives/fused_ce.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stagewise.model.objectives.fused_ce import fusable, output_layer_cross_entropy


@pytest.mark.parametrize("rows, chunk", [(37, 8), (64, 64), (5, 128)])
def test_loss_and_gradients_are_the_plain_ones(rows, chunk):
    g = torch.Generator().manual_seed(rows)
    hidden = torch.randn(rows, 16, generator=g, requires_grad=True)
    weight = (torch.randn(50, 16, generator=g) * 0.3).requires_grad_()
    labels = torch.randint(0, 50, (rows,), generator=g)

    plain = F.cross_entropy(hidden @ weight.T, labels, reduction="sum")
    (plain * 0.5).backward()  # a scale on the loss reaches both gradients
    want = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    fused = output_layer_cross_entropy(hidden, weight, labels, chunk=chunk)
    (fused * 0.5).backward()
    assert torch.allclose(fused, plain, rtol=1e-5)
    assert torch.allclose(hidden.grad, want[0], atol=1e-5) and torch.allclose(weight.grad, want[1], atol=1e-5)


def test_only_a_plain_bias_free_head_outside_autocast_is_fused():
    assert fusable(torch.nn.Linear(4, 8, bias=False))
    assert not fusable(torch.nn.Linear(4, 8, bias=True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fusable(torch.nn.Linear(4, 8, bias=False))


def test_a_frozen_head_gets_no_gradient_and_no_grad_gives_the_same_loss():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(20, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g) * 0.3  # frozen: LoRA trains other layers
    labels = torch.randint(0, 50, (20,), generator=g)
    plain = F.cross_entropy(hidden @ weight.T, labels, reduction="sum")
    plain.backward()
    want = hidden.grad.clone()
    hidden.grad = None
    fused = output_layer_cross_entropy(hidden, weight, labels, chunk=8)
    fused.backward()
    assert weight.grad is None and torch.allclose(hidden.grad, want, atol=1e-5)
    with torch.no_grad():
        loss = output_layer_cross_entropy(hidden, weight, labels, chunk=8)
    assert not loss.requires_grad and torch.allclose(loss, plain, rtol=1e-5)
