"""The quantization report: what each operator became, what it costs, and what it did to accuracy.

One dict (JSON artifact and `stagewise quantize --json`): `effective_bits` (average storage bits
per weight over the searched operators: the budget's scope), `effective_bits_all` (every
operator, the kept-BF16 ones included), `recounted_bits` (the same recounted from the export's
files; equal to effective_bits by construction, checked), `formats` (module -> format),
`table` (per operator: kind, format, weights, FLOP share, sensitivity of each format),
`flop_share` and `weight_share` per format, `bf16` / `quantized` / `deltas` of every score,
`method`, `device` and `emulated` (whether NVFP4 ran as our CPU fake quantization or modelopt's
CUDA kernels: a CPU run with any `QuantFormat.cpu_emulated` format).
"""

from __future__ import annotations

from collections import defaultdict

from stagewise.quant.formats import format_named
from stagewise.quant.operators import Operator
from stagewise.quant.plan import Plan, effective_bits


def build_report(plan: Plan, ops: list[Operator], flops: dict[str, float], recounted: float,
                 bf16: dict[str, float], quantized: dict[str, float], device: str) -> dict:
    """The report of a finished quantization (see the module docstring for its keys)."""
    total_flops = sum(flops.values()) or 1.0
    total_weights = sum(op.numel for op in ops) or 1
    flop_share: dict[str, float] = defaultdict(float)
    weight_share: dict[str, float] = defaultdict(float)
    table = []
    for op in ops:
        fmt = plan.formats[op.name]
        flop_share[fmt] += flops.get(op.name, 0.0) / total_flops
        weight_share[fmt] += op.numel / total_weights
        table.append({"module": op.name, "kind": op.kind, "format": fmt, "weights": op.numel,
                      "bits": format_named(fmt).bits, "flop_share": flops.get(op.name, 0.0) / total_flops,
                      "searched": op.name in plan.searched, "sensitivity": plan.scores.get(op.name, {})})
    emulated = device == "cpu" and any(format_named(f).cpu_emulated for f in plan.formats.values())
    return {
        "method": plan.method, "device": device, "emulated": emulated,
        "effective_bits": effective_bits(plan, ops), "effective_bits_all": effective_bits(plan, ops, over="all"),
        "recounted_bits": recounted, "formats": dict(plan.formats), "table": table,
        "flop_share": dict(flop_share), "weight_share": dict(weight_share),
        "bf16": bf16, "quantized": quantized,
        "deltas": {k: quantized[k] - bf16[k] for k in bf16 if k in quantized},
    }


def summary_lines(report: dict) -> list[str]:
    """The few lines a person reads in the stage log or the terminal."""
    counts: dict[str, int] = defaultdict(int)
    for fmt in report["formats"].values():
        counts[fmt] += 1
    lines = [f"{report['effective_bits']:.2f} effective bits over the searched operators "
             f"({report['effective_bits_all']:.2f} over all; recounted from the export {report['recounted_bits']:.2f}), "
             f"by {report['method']} on {report['device']}" + (" (NVFP4 emulated in PyTorch)" if report["emulated"] else ""),
             "operators: " + ", ".join(f"{n} {fmt}" for fmt, n in sorted(counts.items())) + "; FLOP share: " +
             ", ".join(f"{fmt} {share:.0%}" for fmt, share in sorted(report["flop_share"].items()))]
    for k, d in sorted(report["deltas"].items()):
        lines.append(f"{k}: bf16 {report['bf16'][k]:.4g} -> quantized {report['quantized'][k]:.4g} ({d:+.4g})")
    return lines
