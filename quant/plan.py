"""Choose a format per operator: AutoQuantize's search under a budget, or the Ultra report's fixed heuristic.

A `Plan` is the choice (module name -> nvfp4 | fp8 | bf16) with the evidence behind it. modelopt's
`auto_quantize` calibrates every candidate format on every operator and measures each one's
sensitivity (gradient scores: the Fisher-diagonal Taylor term of docs/ALGORITHMS.md section 8);
the choice under the budget is our exact multiple-choice knapsack over those scores
(quant/knapsack.py), for both budgets:
- `effective_bits`: cost = weight elements x the format's storage bits (`QuantFormat.bits`), over
  the searched operators. modelopt's own solver is not used for it: its accounting counts a fused
  experts module by one of its two projections (tiny: 131,072 of 262,144 weights) and disabled
  layers at 16 bits inside the budget, so its answer can overrun a budget counted over the weights
  the export holds, and a pinned output layer would eat the searched layers' budget.
- `flops`: modelopt has no compute budget at all; cost = the operator's FLOPs per token x the
  format's tensor-core time per FLOP (quant/flops.py, `QuantFormat.flop_cost`).
Pins: `keep_bf16` operators are left out of the search (modelopt's `disabled_layers`; outside the
budget, as in modelopt), `pins` to a format become single-format search spaces (inside it). A pin
on one of Q/K/V applies to all three (they share a format).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from stagewise.data.errors import BadInput
from stagewise.quant.config import QuantizeConfig
from stagewise.quant.flops import format_cost
from stagewise.quant.formats import UNQUANTIZED, format_named, format_with_num_bits
from stagewise.quant.knapsack import solve
from stagewise.quant.operators import NOT_OPERATORS, Operator, group_of, matches, operators
from stagewise.quant.quantizers import plan_config, search_formats


@dataclass
class Plan:
    formats: dict[str, str]
    """Every operator's format (module name -> nvfp4 | fp8 | bf16)."""
    searched: list[str]
    """Operators the budget covers (all but the keep_bf16 ones)."""
    method: str
    """How the choice was made: modelopt-lp (effective bits), knapsack (flops) or ultra-heuristic."""
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    """Sensitivity of each searched operator per format (its group's: Q/K/V share one; empty for the heuristic)."""


def fixed_formats(ops: list[Operator], cfg: QuantizeConfig) -> dict[str, str]:
    """Operators whose format is decided by the config alone: keep_bf16, then pins (later wins), per group."""
    fixed: dict[str, str] = {}
    for op in ops:
        if matches(op.name, cfg.keep_bf16):
            fixed[op.name] = UNQUANTIZED
    for pin in cfg.pins:
        hit = {group_of(op.name) for op in ops if matches(op.name, [pin.pattern])}
        if not hit:
            raise BadInput(f"pins: pattern {pin.pattern!r} matches no quantizable operator "
                           f"(e.g. {', '.join(op.name for op in ops[:3])})")
        for op in ops:
            if group_of(op.name) in hit:
                fixed[op.name] = pin.format
    return fixed


ULTRA = {"routed_experts": "nvfp4", "shared_expert": "fp8", "mamba_in": "fp8", "mamba_out": "fp8"}
"""The Ultra report's fixed heuristic by operator kind; every other kind (attention, MLP, output) stays BF16."""


def ultra_plan(model: torch.nn.Module, cfg: QuantizeConfig) -> Plan:
    ops = operators(model)
    chosen = {op.name: ULTRA.get(op.kind, UNQUANTIZED) for op in ops} | fixed_formats(ops, cfg)
    return Plan(formats=chosen, searched=[op.name for op in ops], method="ultra-heuristic")


def search_plan(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], cfg: QuantizeConfig,
                device: str, flops: Callable[[list[str]], dict[str, float]] | None = None) -> Plan:
    """Score every operator in every format with modelopt's AutoQuantize on `model` (modified in place:
    pass a copy), then choose under the budget.

    `batches` carry input_ids and labels (the loss gives the gradients the scores need)."""
    import modelopt.torch.quantization as mtq  # noqa: PLC0415 (nvidia-modelopt: 7 s to import, only where a model is quantized)

    ops = operators(model)
    fixed = fixed_formats(ops, cfg)
    kept = [n for n, f in fixed.items() if f == UNQUANTIZED]
    searched = [op.name for op in ops if op.name not in kept]
    if not searched:
        raise BadInput("keep_bf16/pins leave no operator to quantize")
    candidates = search_formats(cfg.formats, device)
    spaces = [{"module_name_patterns": [name], "quantization_formats": search_formats([fmt], device),
               "allow_no_quant": False} for name, fmt in fixed.items() if fmt != UNQUANTIZED]
    # The constraint is left loose (16 bits): modelopt's run gives calibration and the scores, the
    # choice is ours (see the module docstring for why modelopt's own budget cannot be used).
    _, state = mtq.auto_quantize(
        model, constraints={"effective_bits": 16.0}, quantization_formats=candidates,
        data_loader=batches, forward_step=lambda m, b: m(**b), loss_func=lambda out, b: out.loss,
        disabled_layers=list(NOT_OPERATORS) + kept, num_calib_steps=min(cfg.calib_batches, len(batches)),
        num_score_steps=min(cfg.score_batches, len(batches)), module_search_spaces=spaces or None)
    # Disabled layers (keep_bf16, conv1d, routers) appear with BF16 as their only choice: not searched.
    stats = {k: st for k, st in state["candidate_stats"].items() if set(st["module_names"]) <= set(searched)}
    scores = {m: {format_of(r): float(s) for r, s in zip(st["formats"], st["scores"])}
              for st in stats.values() for m in st["module_names"]}
    if cfg.budget == "effective_bits":
        numel = {op.name: float(op.numel) for op in ops}
        chosen = _knapsack(stats, lambda names: {n: numel[n] for n in names}, "bits", cfg.effective_bits / 16.0)
    else:
        if flops is None:
            raise ValueError("a flops budget needs the operators' FLOPs")
        chosen = _knapsack(stats, flops, "flops", cfg.flop_fraction)
    plan = Plan(formats={}, searched=searched, method=f"modelopt-scores+knapsack({cfg.budget})", scores=scores)
    plan.formats = {op.name: chosen.get(op.name, fixed.get(op.name, UNQUANTIZED)) for op in ops}
    return plan


def format_of(recipe: Any) -> str:
    """Our format name for one of modelopt's candidate recipes, read from its weight quantizer's bits
    (`QuantFormat.num_bits`); a recipe without an enabled weight quantizer is BF16."""
    for entry in recipe.config.quant_cfg:
        cfg = getattr(entry, "cfg", None)
        if getattr(entry, "quantizer_name", "") == "*weight_quantizer" and cfg is not None and entry.enable:
            return format_with_num_bits(cfg.num_bits).name
    return UNQUANTIZED


def _cost(size: float, fmt: str, kind: str) -> float:
    """An operator's cost in a format: weight bits (size = elements) or compute time (size = FLOPs)."""
    return size * format_named(fmt).bits / 16.0 if kind == "bits" else format_cost(size, fmt)


def _knapsack(stats: dict[str, dict], size: Callable[[list[str]], dict[str, float]], kind: str,
              fraction: float) -> dict[str, str]:
    """One format per searched group minimising summed scores under `fraction` of the all-BF16 cost."""
    keys = list(stats)
    per_op = size([m for k in keys for m in stats[k]["module_names"]])
    groups, labels = [], []
    for k in keys:
        group_size = sum(per_op[m] for m in stats[k]["module_names"])
        options = [(format_of(r), float(s)) for r, s in zip(stats[k]["formats"], stats[k]["scores"])]
        if not stats[k].get("allow_no_quant", True):
            options = [o for o in options if o[0] != UNQUANTIZED]
        labels.append([fmt for fmt, _ in options])
        groups.append([(score, _cost(group_size, fmt, kind)) for fmt, score in options])
    budget = fraction * sum(_cost(sum(per_op[m] for m in stats[k]["module_names"]), UNQUANTIZED, kind) for k in keys)
    choice = solve(groups, budget)
    return {m: labels[i][pick] for i, (k, pick) in enumerate(zip(keys, choice.picks)) for m in stats[k]["module_names"]}


def effective_bits(plan: Plan, ops: Iterable[Operator], over: str = "searched") -> float:
    """Average storage bits per weight element: over the searched operators (the budget's scope) or all."""
    pool = [op for op in ops if over == "all" or op.name in plan.searched]
    total = sum(op.numel for op in pool)
    return sum(op.numel * format_named(plan.formats[op.name]).bits for op in pool) / total if total else 16.0


def quantize_with_plan(model: torch.nn.Module, plan: Plan, batches: list[dict[str, torch.Tensor]],
                       device: str) -> torch.nn.Module:
    """Insert the plan's quantizers into `model` and calibrate their ranges (amax) on `batches`."""
    import modelopt.torch.quantization as mtq  # noqa: PLC0415 (nvidia-modelopt: 7 s to import, only where a model is quantized)

    def calibrate(m: torch.nn.Module) -> None:
        with torch.no_grad():
            for b in batches:
                m(input_ids=b["input_ids"])

    return mtq.quantize(model, plan_config(plan.formats, device), forward_loop=calibrate)


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """An independent copy (the search quantizes its model in place)."""
    return copy.deepcopy(model)
