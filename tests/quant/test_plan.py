"""Plans: the constraints hold in every chosen plan, the budgets are respected, the Ultra heuristic by kind."""

from __future__ import annotations

import pytest

from stagewise.data.errors import BadInput
from stagewise.quant.config import Pin, QuantizeConfig
from stagewise.quant.operators import group_of, operators
from stagewise.quant.plan import copy_model, effective_bits, fixed_formats, search_plan, ultra_plan


def _search(model, batches, **kw):
    from stagewise.quant.flops import operator_flops

    cfg = QuantizeConfig(calib_batches=2, score_batches=2, **kw)
    return search_plan(copy_model(model), batches, cfg, "cpu", flops=lambda names: operator_flops(model, names))


@pytest.fixture(scope="module")
def bits_plan(tiny_model, batches):
    return _search(tiny_model, batches, effective_bits=6.0, pins=[Pin(pattern="model.layers.4.mixer.up_proj", format="fp8")])


def test_operators_of_tiny_are_its_matmuls_with_kinds(tiny_model):
    ops = {op.name: op for op in operators(tiny_model)}
    assert ops["model.layers.2.mixer.experts"].kind == "routed_experts"
    assert ops["model.layers.2.mixer.experts"].numel == 2 * 8 * 128 * 128
    assert ops["lm_head"].kind == "lm_head" and ops["model.layers.1.mixer.k_proj"].kind == "attn_qkv"
    assert not any("conv1d" in n or n.endswith(".gate") or "embeddings" in n for n in ops)
    assert group_of("model.layers.1.mixer.v_proj") == group_of("model.layers.1.mixer.q_proj") == "model.layers.1.mixer.qkv"


def test_default_constraints_keep_output_and_qkv_bf16_and_pins_apply(bits_plan, tiny_model):
    f = bits_plan.formats
    assert f["lm_head"] == "bf16"
    assert {f[f"model.layers.1.mixer.{p}_proj"] for p in "qkv"} == {"bf16"}
    assert f["model.layers.4.mixer.up_proj"] == "fp8"  # pinned
    assert set(f) == {op.name for op in operators(tiny_model)}
    assert "lm_head" not in bits_plan.searched


def test_the_bits_budget_holds_and_a_lower_budget_gives_fewer_bits(bits_plan, tiny_model, batches):
    ops = operators(tiny_model)
    assert effective_bits(bits_plan, ops) <= 6.0 + 1e-9
    low = _search(tiny_model, batches, effective_bits=4.8)
    assert effective_bits(low, ops) <= 4.8 + 1e-9 < 6.0
    assert bits_plan.method == "modelopt-scores+knapsack(effective_bits)" and bits_plan.scores


def test_the_flops_budget_holds(tiny_model, batches):
    from stagewise.quant.flops import format_cost, operator_flops

    plan = _search(tiny_model, batches, budget="flops", flop_fraction=0.4)
    flops = operator_flops(tiny_model, plan.searched)
    cost = sum(format_cost(flops[n], plan.formats[n]) for n in plan.searched)
    assert plan.method == "modelopt-scores+knapsack(flops)" and cost <= 0.4 * sum(flops.values()) * (1 + 1e-9)
    assert {plan.formats[f"model.layers.1.mixer.{p}_proj"] for p in "qkv"} == {"bf16"}


def test_a_pin_on_q_moves_k_and_v_too_and_a_pin_matching_nothing_is_refused(tiny_model):
    ops = operators(tiny_model)
    fixed = fixed_formats(ops, QuantizeConfig(keep_bf16=[], pins=[Pin(pattern="*.q_proj", format="fp8")]))
    assert {fixed[f"model.layers.1.mixer.{p}_proj"] for p in "qkv"} == {"fp8"}
    with pytest.raises(BadInput, match="nothing_like_this"):
        fixed_formats(ops, QuantizeConfig(pins=[Pin(pattern="nothing_like_this*", format="fp8")]))


def test_ultra_heuristic_by_kind(tiny_model):
    plan = ultra_plan(tiny_model, QuantizeConfig(preset="ultra"))
    kinds = {op.name: op.kind for op in operators(tiny_model)}
    for name, fmt in plan.formats.items():
        want = {"routed_experts": "nvfp4", "shared_expert": "fp8", "mamba_in": "fp8", "mamba_out": "fp8"}.get(kinds[name], "bf16")
        assert fmt == want, name
