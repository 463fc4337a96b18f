"""The CPU NVFP4 emulation (docs/ALGORITHMS.md §8): bit-exact with modelopt's pure-torch
reference, right on hand-computed values, and usable as modelopt's backend on CPU."""

import warnings

import pytest
import torch

from stagewise.quant.nvfp4_emulation import BACKEND, fake_quant_nvfp4, register_cpu_backend, with_cpu_backend

MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


@pytest.fixture(scope="module")
def mtq():
    import modelopt.torch.quantization as mtq  # ~10 s: only the tests that need it pay

    return mtq


def reference(x, amax=None):
    """modelopt's NVFP4QTensor quantize + dequantize (the pure-torch path: no CUDA here)."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    s2 = None if amax is None else amax.float() / (6.0 * 448.0)
    q, sb, s2 = NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=s2)
    return q.dequantize(dtype=x.dtype, scale=sb, double_scale=s2, block_sizes={-1: 16})


def tie_tensor():
    """Rows of 16: one setting amax = 6*448 (so s2 = 1 exactly), blocks of block scale 1 and 2
    whose values sit exactly on the E2M1 rounding midpoints, and an all-zero block."""
    head = torch.zeros(16)
    head[0] = 2688.0
    ties = torch.tensor([6.0, *MIDPOINTS, -6.0, *(-m for m in MIDPOINTS)])
    return torch.stack([head, ties, 2 * ties, torch.zeros(16)])


def random_tensor(shape, seed, dtype=torch.float32):
    """Values whose block magnitudes span many octaves (one row tiny enough to hit 2**-9)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(*shape[:-1], 1, generator=g))
    x.view(-1, shape[-1])[0] *= 1e-8
    return x.to(dtype)


def test_ties_round_half_to_even_like_reference():
    x = tie_tensor()
    out = fake_quant_nvfp4(x)
    assert torch.equal(out, reference(x))
    assert out[1, 1:8].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]  # even mantissa wins
    assert out[2, 1:8].tolist() == [0.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0]
    assert out[3].abs().sum() == 0


@pytest.mark.parametrize(
    "shape,dtype",
    [((16,), torch.float32), ((4, 32), torch.float32), ((2, 3, 64), torch.float32),
     ((8, 48), torch.bfloat16), ((5, 80), torch.float16)],
)
def test_bit_exact_with_reference(shape, dtype):
    for seed in range(3):
        x = random_tensor(shape, seed, dtype)
        out = fake_quant_nvfp4(x)
        assert out.dtype == dtype and out.shape == x.shape
        assert torch.equal(out, reference(x))


@pytest.mark.parametrize("factor", [0.5, 3.0])  # calibrated amax below (saturates) and above x's
def test_calibrated_amax_matches_reference(factor):
    x = random_tensor((6, 64), 7)
    amax = x.abs().amax() * factor
    assert torch.equal(fake_quant_nvfp4(x, amax), reference(x, amax))


def test_padding_is_cut_back():
    x = random_tensor((3, 20), 1)
    padded = torch.nn.functional.pad(x, (0, 12))
    assert torch.equal(fake_quant_nvfp4(x), reference(padded)[:, :20])


def test_hand_computed_block():
    # amax 2688 -> s2 = 1; block amax 3 -> sb = 3/6 = 0.5 (exact in E4M3); q = round(x / 0.5)
    x = torch.tensor([0.1, 0.2, 0.3, 0.6, 0.9, 1.1, 1.4, 3.0, -0.7, -2.2, 0.0, 0.25, -0.6, 1.6, 2.0, -3.0])
    want = [0.0, 0.25, 0.25, 0.5, 1.0, 1.0, 1.5, 3.0, -0.75, -2.0, 0.0, 0.25, -0.5, 1.5, 2.0, -3.0]
    assert fake_quant_nvfp4(x, torch.tensor(2688.0)).tolist() == want
    # block amax 3000 > 6*448*s2: sb clamps to 448 and q saturates at 6 -> 6 * 448 = 2688
    y = torch.tensor([3000.0, -3000.0, 448.0] + [0.0] * 13)
    assert fake_quant_nvfp4(y, torch.tensor(2688.0))[:3].tolist() == [2688.0, -2688.0, 448.0]


def test_all_zero_tensor_and_gradient():
    assert torch.equal(fake_quant_nvfp4(torch.zeros(2, 16)), torch.zeros(2, 16))
    x = torch.randn(2, 32, requires_grad=True)
    fake_quant_nvfp4(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # straight through


NVFP4_BLOCKS = {-1: 16, "type": "dynamic", "scale_bits": [4, 3]}


def test_with_cpu_backend_marks_only_fp4_entries(mtq):
    cfg = {"quant_cfg": [
        {"quantizer_name": "*", "enable": False},
        {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": [2, 1], "block_sizes": NVFP4_BLOCKS}},
        {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}},
        {"quantizer_name": "*w4a8*", "cfg": [{"num_bits": (2, 1), "block_sizes": NVFP4_BLOCKS}, {"num_bits": (4, 3)}]},
    ], "algorithm": "max"}
    out = with_cpu_backend(cfg)
    assert out["quant_cfg"][1]["cfg"]["backend"] == BACKEND
    assert "backend" not in out["quant_cfg"][2]["cfg"]
    assert [c.get("backend") for c in out["quant_cfg"][3]["cfg"]] == [BACKEND, None]
    assert "backend" not in cfg["quant_cfg"][1]["cfg"]  # a copy
    default = with_cpu_backend(mtq.NVFP4_DEFAULT_CFG)
    marked = [e["quantizer_name"] for e in default["quant_cfg"] if "backend" in e.get("cfg", {})]
    assert marked == ["*weight_quantizer", "*input_quantizer"]


@pytest.mark.parametrize("name", ["MXFP4_DEFAULT_CFG", "NVFP4_W4A4_WEIGHT_MSE_FP8_SWEEP_CFG",
                                  "NVFP4_FOUR_OVER_SIX_CFG"])
def test_with_cpu_backend_refuses_other_fp4_variants(mtq, name):
    with pytest.raises(ValueError, match="not dynamic NVFP4"):
        with_cpu_backend(getattr(mtq, name))


def test_register_twice_is_silent(mtq):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_cpu_backend()
        register_cpu_backend()


def test_mtq_quantize_runs_on_cpu(mtq):
    torch.manual_seed(0)
    # one layer: on Gaussian data each NVFP4 tensor (input, weight) has ~10% rms error, so the
    # output's relative error is ~0.14 (a second quantized layer would take it to ~0.2)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    calib = [torch.randn(8, 64) for _ in range(4)]
    x = torch.randn(8, 64)
    with torch.no_grad():
        ref = model(x)

    def forward_loop(m):
        for batch in calib:
            m(batch)

    mtq.quantize(model, with_cpu_backend(mtq.NVFP4_DEFAULT_CFG), forward_loop=forward_loop)
    first = model[0]
    assert first.weight_quantizer.backend == BACKEND and first.input_quantizer.amax is not None
    with torch.no_grad():
        out = model(x)
        # the first layer is exactly our rule applied to its input and weight with calibrated amax
        manual = torch.nn.functional.linear(
            fake_quant_nvfp4(x, first.input_quantizer.amax),
            fake_quant_nvfp4(first.weight, first.weight_quantizer.amax), first.bias)
        assert torch.equal(first(x), manual)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.2
