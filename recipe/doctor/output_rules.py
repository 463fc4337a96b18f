"""The recipe doctor's rules on what a recipe hands out and judges by: quantization and gates.

Same contract as recipe/doctor/training_rules.py: `rule(facts) -> findings`, the docstring's first line is
what `stagewise check --help` prints, the rest says why and where the advice comes from.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from stagewise.data.errors import BadInput
from stagewise.recipe.doctor.findings import Finding, advise
from stagewise.recipe.errors import did_you_mean

if TYPE_CHECKING:
    from stagewise.eval.gates import GateConfig
    from stagewise.recipe.doctor.facts import Facts

REF_QUANT = ("Nemotron 3 Super and Ultra tech reports, quantization: embeddings, the output layer and attention "
             "Q/K/V stay BF16")
REF_REVIEW = ("flows/gate_review.py: a reviewed gate pauses its flow run until someone answers in the Prefect UI, "
              "which a temporary API server does not serve (ours)")
REF_GATE = "eval/gates.py: a gate naming a metric that is never logged fails at its first evaluation (ours)"
SENSITIVE = {"lm_head": "the output layer (lm_head)", "attn_qkv": "attention Q/K/V"}
"""Operator kinds (quant/operators.py) both reports keep in BF16. The embeddings are no operator:
a lookup is never quantized, unless the output layer is tied to it."""


def quantize_sensitive(facts: Facts) -> Iterator[Finding]:
    """A quantize stage that quantizes the output layer (lm_head, and so tied embeddings) or attention
    Q/K/V: pinned to NVFP4/FP8 (error) or left to the search by keep_bf16 (warning).

    Both Nemotron 3 reports keep the embeddings, the output layer and Q/K/V in BF16: they are a
    small share of the weights and the most sensitive to rounding. The operators and what
    keep_bf16, pins and the preset decide for them are quant/plan.py's, on the meta-device model."""
    q, ops = facts.recipe.stages.quantize, facts.operators
    if q is None or ops is None:
        return
    from stagewise.quant.plan import ULTRA, fixed_formats  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

    try:
        fixed = fixed_formats(ops, q)
    except BadInput as e:  # a pin that matches nothing: the stage would stop there
        yield advise("error", "stages.quantize.pins", str(e), None, REF_QUANT, "quantize")
        return
    tied = " (tied to the input embeddings: they are quantized too)" if facts.model and facts.model.tied_embeddings else ""
    for kind, label in SENSITIVE.items():
        mine = [op.name for op in ops if op.kind == kind]
        chosen = {n: fixed.get(n, ULTRA.get(kind, "bf16") if q.preset == "ultra" else None) for n in mine}
        pinned = sorted({f for f in chosen.values() if f not in (None, "bf16")})
        searched = [n for n, f in chosen.items() if f is None]
        tail = tied if kind == "lm_head" else ""
        if pinned:
            yield advise("error", _pin_field(q, mine), f"{label} is pinned to {', '.join(pinned)}{tail}: keep it BF16",
                         len([n for n, f in chosen.items() if f in pinned]), REF_QUANT, "quantize")
        elif searched:
            yield advise("warning", "stages.quantize.keep_bf16", f"{len(searched)} of {len(mine)} {label} operators "
                         f"are left to the search, which may give them {'/'.join(q.formats)}{tail}: add them to "
                         "keep_bf16", len(searched), REF_QUANT, "quantize")


def _pin_field(q, names: list[str]) -> str:
    """The last pin (the one that wins) matching any of `names`."""
    from stagewise.quant.operators import group_of, matches  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

    groups = {group_of(n) for n in names}
    hits = [j for j, pin in enumerate(q.pins) if any(group_of(n) in groups and matches(n, [pin.pattern]) for n in names)]
    return f"stages.quantize.pins[{hits[-1]}]" if hits else "stages.quantize.pins"


def _gated(facts: Facts) -> Iterator[tuple[str, str, GateConfig]]:
    """(stage, field path, gate) of every gated stretch (pretraining, each SFT sub-stage: what each
    stage's block declares, recipe/blocks/contract.py)."""
    for stage, s in facts.stretches:
        if s.gate:
            yield stage, f"{s.at}.gate", s.gate


def _gate_names(at: str, gate: GateConfig) -> Iterator[tuple[str, str]]:
    """(field path, metric) of every metric a gate reads."""
    for group in ("all", "any", "guards"):
        for k, item in enumerate(getattr(gate, group)):
            yield f"{at}.{group}[{k}].metric", item.metric
    if gate.patience and gate.primary:
        yield f"{at}.primary", gate.primary


def gate_metric(facts: Facts) -> Iterator[Finding]:
    """A gate naming an eval metric that no evaluation of its stage logs (validation or held-out
    conversations, and the tasks of the gate's suite, from their lm-eval YAML metric_list).

    The gate would fail at its first evaluation, after the first stretch has trained. Names from
    training itself (train/, moe/, act/, data/) and from lm-eval's standard tasks are not judged:
    which exist depends on the objective, or only lm-eval knows them."""
    from stagewise.recipe.doctor.facts import TRAINING_PREFIXES  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

    for stage, at, gate in _gated(facts):
        known, outside = facts.gate_metrics(stage, gate.suite)
        for field, name in _gate_names(at, gate):
            if name.startswith(TRAINING_PREFIXES) or any(name.startswith(f"eval/{t}/") for t in outside):
                continue
            if name not in known:
                hint = did_you_mean(name, known) or f"; logged at its marks: {', '.join(sorted(known)[:8])} ..."
                yield advise("error", field, f"no evaluation of {stage} logs {name!r}{hint}", name, REF_GATE, stage)


def gate_review_unreachable(facts: Facts) -> Iterator[Finding]:
    """A gate a person reviews, with no Prefect server to review it on: without PREFECT_API_URL the run's
    flows report to a temporary API server in its own process, which serves no UI, so nobody can answer
    the form and the stage waits out its whole `review_timeout_s` before the gate's own decision stands."""
    if os.environ.get("PREFECT_API_URL"):
        return
    for stage, at, gate in _gated(facts):
        if gate.review != "never":
            yield advise("warning", f"{at}.review", f"review: {gate.review} waits up to {gate.review_timeout_s:.0f} s "
                         "for a person in the Prefect UI, and PREFECT_API_URL is not set: this run's temporary API "
                         "server serves no UI. Start `prefect server start` and set PREFECT_API_URL to its /api",
                         gate.review_timeout_s, REF_REVIEW, stage)
