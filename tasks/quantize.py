"""Prefect tasks of the quantize stage: score a model, and quantize + export + reload a checkpoint.

Thin: the work is quant/ (plan, quantize, export, load) and eval/ (held-out answers, validation
loss, lm-eval: eval/scoring.py); these tasks wire them, time them and log to MLflow. `quantize_checkpoint` is also
what `stagewise quantize` runs (through `.fn`, outside a flow), so the CLI and the stage quantize
the same way.
"""

from __future__ import annotations

import time

from prefect import task
from transformers import AutoTokenizer

from stagewise.eval.scoring import Scoring, score_model
from stagewise.model.build import load_model
from stagewise.quant.config import QuantizeConfig
from stagewise.quant.export import export_checkpoint, recounted_effective_bits
from stagewise.quant.flops import operator_flops
from stagewise.quant.load import load_quantized
from stagewise.quant.operators import operators
from stagewise.quant.plan import copy_model, quantize_with_plan, search_plan, ultra_plan
from stagewise.quant.report import build_report
from stagewise.store.policy import retrying, run_logger


@task(**retrying("quantize"))
def quantize_checkpoint(source: str, cfg: QuantizeConfig, batches: list[dict], scoring: Scoring, out_dir: str,
                        device: str, meta: dict | None = None) -> dict:
    """Plan, quantize, export to `out_dir` and score the reloaded export against the BF16 start.

    Returns the report (quant/report.py) with `export` (the directory), `seconds` per phase and `items`
    (each held-out conversation's scores, per side: the closing table's interval)."""
    log, seconds = run_logger(), {}
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = load_model(source, device=device).eval()
    t = time.perf_counter()
    bf16 = score_model(model, tokenizer, scoring, device)
    seconds["score_bf16"] = time.perf_counter() - t
    ops = operators(model)
    flops = operator_flops(model, [op.name for op in ops])
    t = time.perf_counter()
    if cfg.preset == "ultra":
        plan = ultra_plan(model, cfg)
    else:
        plan = search_plan(copy_model(model), batches, cfg, device,
                           flops=lambda names: {n: flops[n] for n in names})
    seconds["search"] = time.perf_counter() - t
    log.info("quantize: plan by %s: %s", plan.method, _counts(plan.formats))
    t = time.perf_counter()
    quantized = quantize_with_plan(model, plan, batches, device)
    export_checkpoint(quantized, plan, source, out_dir, meta=meta)
    seconds["quantize_export"] = time.perf_counter() - t
    del quantized, model
    t = time.perf_counter()
    reloaded = load_quantized(out_dir, device=device)
    after = score_model(reloaded, tokenizer, scoring, device)
    seconds["score_quantized"] = time.perf_counter() - t
    recounted = recounted_effective_bits(out_dir, plan.searched)
    report = build_report(plan, ops, flops, recounted, bf16.metrics, after.metrics, device)
    return report | {"export": str(out_dir), "seconds": seconds, "items": {"bf16": bf16.items, "quantized": after.items}}


def _counts(formats: dict[str, str]) -> str:
    out: dict[str, int] = {}
    for fmt in formats.values():
        out[fmt] = out.get(fmt, 0) + 1
    return ", ".join(f"{n} {fmt}" for fmt, n in sorted(out.items()))
