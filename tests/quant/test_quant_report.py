"""The report: shares add up, deltas are quantized - bf16, and its chart renders."""

from __future__ import annotations

import pytest

from stagewise.quant.operators import Operator
from stagewise.quant.plan import Plan
from stagewise.quant.report import build_report, summary_lines


def _report():
    ops = [Operator("a", "mlp", 300), Operator("b", "routed_experts", 600), Operator("lm_head", "lm_head", 100)]
    plan = Plan(formats={"a": "fp8", "b": "nvfp4", "lm_head": "bf16"}, searched=["a", "b"], method="test",
                scores={"a": {"fp8": 0.1, "nvfp4": 0.5, "bf16": 0.0}})
    flops = {"a": 600.0, "b": 300.0, "lm_head": 100.0}
    return build_report(plan, ops, flops, 5.666666, {"test/exact_match": 0.5, "test/loss": 1.0},
                        {"test/exact_match": 0.45, "test/loss": 1.1}, "cpu")


def test_report_figures():
    r = _report()
    assert r["effective_bits"] == pytest.approx((300 * 8 + 600 * 4.5) / 900)
    assert r["effective_bits_all"] == pytest.approx((300 * 8 + 600 * 4.5 + 100 * 16) / 1000)
    assert r["flop_share"] == pytest.approx({"fp8": 0.6, "nvfp4": 0.3, "bf16": 0.1})
    assert r["weight_share"] == pytest.approx({"fp8": 0.3, "nvfp4": 0.6, "bf16": 0.1})
    assert r["deltas"] == pytest.approx({"test/exact_match": -0.05, "test/loss": 0.1})
    assert r["emulated"] is True and r["table"][0]["sensitivity"] == {"fp8": 0.1, "nvfp4": 0.5, "bf16": 0.0}
    assert "5.67 effective bits" in summary_lines(r)[0]


def test_the_formats_chart_renders(tmp_path):
    from stagewise.eval.plots import quant_formats_plot

    fig = quant_formats_plot(_report())
    fig.savefig(tmp_path / "q.png")
    assert (tmp_path / "q.png").stat().st_size > 5000
