"""The recipe doctor: published training guidance as checks over a validated recipe.

    loaded = load_recipe("recipes/tiny.yaml", ["stages.sft.stages[0].optimizer.lr=5e-3"])
    findings = diagnose(loaded)                 # [Finding(rule="finetune-lr", severity="error", ...)]
    print(render(findings)); summary(findings)  # the lines `stagewise check` prints; its --json document

load_recipe already refuses what cannot run (the schema, the cross-field rules of
recipe/checks.py). The doctor advises on what runs but is likely wrong: a warmup that eats
a fine-tune, a fine-tune LR at pretraining's peak, a source read twenty times, an SFT blend of one
domain on an MoE, a long-context stage with no short sequences, ... Each Finding is a warning or
an error, with the number behind it, the recipe field it concerns and its file:line, and the
source of the advice. The rules are recipe/doctor/training_rules.py (training stages) and
recipe/doctor/output_rules.py (quantization, gates); what they know beyond the recipe (model size,
prepared data, logged metric names) is recipe/doctor/facts.py. No Prefect, no MLflow:
`stagewise check` and `stagewise run` (which refuses errors unless --force) call it before any work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stagewise.recipe.doctor import output_rules, training_rules
from stagewise.recipe.doctor.findings import Finding, Rule, Severity, advise, failing, render, rule_name, summary
from stagewise.recipe.errors import cite_location, locate

if TYPE_CHECKING:
    from stagewise.recipe import LoadedRecipe
    from stagewise.recipe.doctor.facts import Facts

__all__ = ["Finding", "Rule", "Severity", "advise", "diagnose", "failing", "render", "rule_name", "rules", "summary"]


def rules() -> list[Rule]:
    """Every rule, in the order findings are reported (pipeline order, roughly)."""
    t, o = training_rules, output_rules
    return [t.warmup, t.finetune_lr, t.epochs, t.moe_narrow_blend, t.long_context_mix, t.sft_normalization,
            t.rl_filter, t.masked_is_inert, t.vllm_moe_on_cpu, o.quantize_sensitive, o.gate_metric,
            o.gate_review_unreachable]


def diagnose(loaded: LoadedRecipe, stages: Sequence[str] | None = None) -> list[Finding]:
    """Every finding of every rule on a loaded recipe, located; only those of `stages` when given."""
    from stagewise.recipe.doctor.facts import Facts  # noqa: PLC0415 (`check --help` lists the rules: no torch, 0.1 s not 4 s)

    facts, out = Facts(loaded, stages), []
    for rule in rules():
        for f in rule(facts):
            where = cite_location(locate(f.field, loaded.sources, str(loaded.path)))
            out.append(f.model_copy(update={"rule": rule_name(rule), "where": where}))
    return [f for f in out if stages is None or f.stage is None or f.stage in stages]


