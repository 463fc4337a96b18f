"""Our Mamba-2 PyTorch functions against transformers' reference ones, and packed rows against documents alone.

The reference is the function transformers' NemotronH module held before `install()` (kept on
our dispatcher as `stagewise_reference`): the SSD scan of Dao & Gu 2024 as transformers writes it.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.nemotron_h import modeling_nemotron_h

from stagewise.model import mamba_torch
from stagewise.model.mamba_torch import causal_conv1d, chunk_scan


def reference(name: str):
    fn = getattr(modeling_nemotron_h, name)
    return getattr(fn, "stagewise_reference", fn)


def scan_inputs(length: int, seed: int = 0, batch: int = 2, heads: int = 4, head_dim: int = 8, groups: int = 2,
                state: int = 16):
    g = torch.Generator().manual_seed(seed)
    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).requires_grad_()
    return {
        "x": rand(batch, length, heads, head_dim), "dt": rand(batch, length, heads),
        "A": (-torch.rand(heads, generator=g) * 4 - 0.5).requires_grad_(),
        "B": rand(batch, length, groups, state), "C": rand(batch, length, groups, state),
        "D": rand(heads), "dt_bias": rand(heads), "initial_states": rand(batch, heads, head_dim, state, scale=0.5),
    }


def outputs_and_grads(fn, inputs: dict, chunk: int, **kwargs):
    y, final = fn(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], chunk, D=inputs["D"],
                  dt_bias=inputs["dt_bias"], initial_states=inputs["initial_states"], dt_softplus=True,
                  return_final_states=True, **kwargs)
    weights = torch.linspace(-1, 1, y.numel()).view_as(y)  # every output position weighs differently
    loss = (y * weights).sum() + final.square().sum()
    grads = torch.autograd.grad(loss, list(inputs.values()))
    return y, final, dict(zip(inputs, grads))


@pytest.mark.parametrize("length,chunk", [(64, 16), (53, 16), (5, 16), (40, 64)])
def test_scan_equals_transformers_reference(length, chunk):
    """Output, final state and every gradient, for whole chunks, a partial last chunk and less than one chunk."""
    inputs = scan_inputs(length)
    y_ref, final_ref, grads_ref = outputs_and_grads(reference("mamba2_chunk_scan"), inputs, chunk)
    y, final, grads = outputs_and_grads(chunk_scan, inputs, chunk)
    assert y.shape == y_ref.shape and y.dtype == torch.float32
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, final_ref, atol=1e-4, rtol=1e-4)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads_ref[name], atol=1e-3, rtol=1e-3, msg=name)


def test_packed_scan_equals_each_document_alone():
    """Documents starting mid-chunk, spanning chunks, of one token: each gets its own output."""
    lengths = [5, 23, 1, 40, 11]  # 80 tokens in chunks of 16
    inputs = scan_inputs(sum(lengths), seed=1, batch=1)
    seq_idx = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
    common = {"D": inputs["D"], "dt_bias": inputs["dt_bias"], "dt_softplus": True}
    x, dt, A, B, C = (inputs[k] for k in "x dt A B C".split())
    packed, final = chunk_scan(x, dt, A, B, C, 16, seq_idx=seq_idx, return_final_states=True, **common)
    start = 0
    for n in lengths:
        part = slice(start, start + n)
        alone, alone_final = chunk_scan(x[:, part], dt[:, part], A, B[:, part], C[:, part], 16,
                                        return_final_states=True, **common)
        torch.testing.assert_close(packed[:, part], alone, atol=1e-4, rtol=1e-4)
        start += n
    torch.testing.assert_close(final, alone_final, atol=1e-4, rtol=1e-4)  # the last document's state


def test_gradients_stay_finite_under_strong_decay():
    """exp(cs[i] - cs[j]) above the diagonal overflows for strong decays: it must never reach a gradient."""
    inputs = scan_inputs(128, seed=2)
    with torch.no_grad():
        inputs["A"].fill_(-60.0)
        inputs["dt"].fill_(5.0)
    _, _, grads = outputs_and_grads(chunk_scan, inputs, 64)
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_conv_equals_transformers_reference():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(2, 12, 30, generator=g), torch.randn(12, 4, generator=g), torch.randn(12, generator=g)
    for activation in (None, "silu"):
        torch.testing.assert_close(causal_conv1d(x, w, b, activation=activation),
                                   reference("causal_conv1d_fn")(x, w, b, activation=activation))


def test_conv_never_reads_across_a_document_boundary():
    x = torch.arange(1.0, 9.0).reshape(1, 1, 8)
    seq_idx = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])
    # each output sums the current and up to 3 previous inputs of the same document
    assert causal_conv1d(x, torch.ones(1, 4), seq_idx=seq_idx).flatten().tolist() == [1, 3, 6, 4, 9, 6, 13, 21]


def test_conv_keeps_the_input_dtype():
    x = torch.randn(1, 4, 6, dtype=torch.bfloat16)
    assert causal_conv1d(x, torch.ones(4, 4), activation="silu").dtype == torch.bfloat16


def test_install_is_idempotent():
    names = ["mamba2_chunk_scan", "causal_conv1d_fn", "mamba2_split_conv1d_scan_combined"]
    mamba_torch.install()
    installed = [getattr(modeling_nemotron_h, n) for n in names]
    mamba_torch.install()
    assert [getattr(modeling_nemotron_h, n) for n in names] == installed
    assert not any(hasattr(f.stagewise_reference, "stagewise_reference") for f in installed)  # never wraps itself


def test_cpu_tensors_take_ours_even_where_the_kernel_imports(monkeypatch):
    calls = []
    monkeypatch.setattr(mamba_torch.mamba_kernels, "kernel", lambda name: lambda x, **_: calls.append("kernel"))
    dispatch = mamba_torch._in_place_of(None, lambda x, **_: calls.append("ours"), "mamba2_chunk_scan")
    dispatch(torch.zeros(1))
    assert calls == ["ours"]


def test_packed_conv_gradients_are_bitwise_reproducible():
    """Float sums in a fixed order: the same inputs give the same bits (a scatter with repeated
    positions summed them in thread order, and packed SFT runs drifted apart)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 384, 512, generator=g)
    weight = torch.randn(384, 4, generator=g)
    seq_idx = torch.zeros(4, 512, dtype=torch.long)
    for row in range(4):  # many documents, some of one token: several taps cross at one position
        for cut in sorted(torch.randint(1, 512, (60,), generator=g).tolist()):
            seq_idx[row, cut:] += 1

    def grads():
        xs, w = x.clone().requires_grad_(), weight.clone().requires_grad_()
        out = causal_conv1d(xs, w, seq_idx=seq_idx)
        out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
        return out.detach(), xs.grad, w.grad

    first = grads()
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))
