"""Export and reload: the files hold the plan's bits, and our loader gives back the in-memory quantized model."""

from __future__ import annotations

import json

import pytest
import torch

from stagewise.quant.export import PLAN_FILE, recount_bits, recounted_effective_bits
from stagewise.quant.formats.nvfp4 import decode_nvfp4
from stagewise.quant.load import load_quantized
from stagewise.quant.operators import operators
from stagewise.quant.plan import Plan, copy_model, effective_bits, quantize_with_plan


def _plan(model) -> Plan:
    """Every kind of operator in some format: NVFP4 (experts, MLP), FP8 (Mamba, shared experts), BF16 (rest)."""
    formats = {}
    for op in operators(model):
        formats[op.name] = {"routed_experts": "nvfp4", "mlp": "nvfp4", "mamba_in": "fp8", "mamba_out": "fp8",
                            "shared_expert": "fp8"}.get(op.kind, "bf16")
    return Plan(formats=formats, searched=[op.name for op in operators(model) if op.kind != "lm_head"], method="test")


@pytest.fixture(scope="module")
def exported(tiny_model, batches, tmp_path_factory):
    from stagewise.quant.export import export_checkpoint

    plan = _plan(tiny_model)
    quantized = quantize_with_plan(copy_model(tiny_model), plan, batches, "cpu")
    with torch.no_grad():
        logits = quantized(input_ids=batches[0]["input_ids"]).logits
    root, src = tmp_path_factory.mktemp("q"), tmp_path_factory.mktemp("src")
    # The export consumes the model it writes: one copy per export. BF16 is the shipped form; FP32
    # keeps the unquantized weights exact, so the reload can be compared bit for bit.
    export_checkpoint(copy_model(quantized), plan, src, root / "bf16", dtype=torch.bfloat16)
    export_checkpoint(quantized, plan, src, root / "fp32", dtype=torch.float32)
    return plan, root, logits


def test_export_is_deployable_form_with_clean_module_names(exported):
    plan, root, _ = exported
    out = root / "bf16"
    for name in ("config.json", "hf_quant_config.json"):
        text = (out / name).read_text()
        assert "sentinel" not in text and "\\u0000" not in text
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert quant["quant_algo"] == "MIXED_PRECISION"
    layers = quant["quantized_layers"]
    assert layers["backbone.layers.2.mixer.experts"]["quant_algo"] == "NVFP4"
    assert layers["backbone.layers.0.mixer.in_proj"]["quant_algo"] == "FP8"
    assert json.loads((out / PLAN_FILE).read_text())["formats"] == plan.formats


def test_recount_from_the_files_equals_the_plans_effective_bits(exported, tiny_model):
    plan, root, _ = exported
    out = root / "bf16"
    counts = recount_bits(out, list(plan.formats))
    ops = {op.name: op for op in operators(tiny_model)}
    for name, (elements, _) in counts.items():
        assert elements == ops[name].numel, name
    assert counts["model.layers.2.mixer.experts"][1] == pytest.approx(ops["model.layers.2.mixer.experts"].numel * 4.5)
    assert recounted_effective_bits(out, plan.searched) == pytest.approx(effective_bits(plan, operators(tiny_model)))


def test_the_reloaded_export_scores_as_the_quantized_model_did(exported, batches):
    _, root, logits = exported
    reloaded = load_quantized(root / "fp32")
    with torch.no_grad():
        again = reloaded(input_ids=batches[0]["input_ids"]).logits
    assert torch.allclose(again, logits, rtol=1e-5, atol=1e-5)


def test_decode_nvfp4_matches_modelopts_packing():
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    w = torch.randn(8, 32, generator=torch.Generator().manual_seed(1))
    q, sb, s2 = NVFP4QTensor.quantize(w, 16)
    want = q.dequantize(dtype=torch.float32, scale=sb, double_scale=s2, block_sizes={-1: 16})
    assert torch.equal(decode_nvfp4(q._quantized_data, sb, s2), want)


def test_an_export_without_a_plan_is_refused(tmp_path):
    from stagewise.data.errors import BadInput

    with pytest.raises(BadInput, match="not a stagewise quantized export"):
        load_quantized(tmp_path)
