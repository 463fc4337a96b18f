"""The recipe doctor: published training guidance as checks over a validated recipe.

    loaded = load_recipe("recipes/tiny.yaml", ["stages.sft.stages[0].optimizer.lr=5e-3"])
    findings = diagnose(loaded)                 # [Finding(rule="finetune-lr", severity="error", ...)]
    print(render(findings)); summary(findings)  # the lines `stagewise check` prints; its --json document

load_recipe already refuses what cannot run (the schema, the cross-field rules of
flows/recipe_checks.py). The doctor advises on what runs but is likely wrong: a warmup that eats
a fine-tune, a fine-tune LR at pretraining's peak, a source read twenty times, an SFT blend of one
domain on an MoE, a long-context stage with no short sequences, ... Each Finding is a warning or
an error, with the number behind it, the recipe field it concerns and its file:line, and the
source of the advice. The rules are flows/doctor_rules.py (training stages) and
flows/doctor_rules_out.py (quantization, gates); what they know beyond the recipe (model size,
prepared data, logged metric names) is flows/doctor_facts.py. No Prefect, no MLflow:
`stagewise check` and `stagewise run` (which refuses errors unless --force) call it before any work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from flows.recipe_errors import cite_location, locate

if TYPE_CHECKING:
    from flows.doctor_facts import Facts
    from flows.recipe import LoadedRecipe

Severity = Literal["warning", "error"]


class Finding(BaseModel):
    """One piece of advice about one recipe field."""

    rule: str = ""
    """The rule that found it (`stagewise check --help` lists them)."""
    severity: Severity
    """error: `stagewise run` refuses the recipe (unless --force); warning: it runs, and says so."""
    field: str
    """The recipe's YAML path the advice concerns, e.g. stages.sft.stages[0].optimizer.lr."""
    where: str = ""
    """file:line that defines the field (or its closest defined parent; `--set k=v` for an override)."""
    message: str
    """What is likely wrong, with the numbers."""
    value: float | int | str | None = None
    """The number behind the finding (a share, an LR, epochs, ...)."""
    reference: str
    """Where the advice comes from (a published recipe, or `ours`)."""
    stage: str | None = Field(None, exclude=True)
    """The stage the finding belongs to (None: the whole recipe), so `run --stages` judges only those."""

    def line(self) -> str:
        return f"{self.severity}: {self.field} ({self.where}): {self.message} [{self.rule}; {self.reference}]"


def advise(severity: Severity, field: str, message: str, value: float | int | str | None, reference: str,
           stage: str | None) -> Finding:
    """A rule's finding; diagnose() adds the rule's name and the field's file:line."""
    return Finding(severity=severity, field=field, message=message, value=value, reference=reference, stage=stage)


Rule = Callable[["Facts"], Iterable[Finding]]


def rules() -> list[Rule]:
    """Every rule, in the order findings are reported (pipeline order, roughly)."""
    from flows import doctor_rules as t
    from flows import doctor_rules_out as o

    return [t.warmup, t.finetune_lr, t.epochs, t.moe_narrow_blend, t.long_context_mix, t.sft_normalization,
            t.rl_filter, o.quantize_sensitive, o.gate_metric]


def rule_name(rule: Rule) -> str:
    """`finetune_lr` -> `finetune-lr`: how findings and --help name a rule."""
    return rule.__name__.replace("_", "-")


def diagnose(loaded: LoadedRecipe, stages: Sequence[str] | None = None) -> list[Finding]:
    """Every finding of every rule on a loaded recipe, located; only those of `stages` when given."""
    from flows.doctor_facts import Facts

    facts, out = Facts(loaded, stages), []
    for rule in rules():
        for f in rule(facts):
            where = cite_location(locate(f.field, loaded.sources, str(loaded.path)))
            out.append(f.model_copy(update={"rule": rule_name(rule), "where": where}))
    return [f for f in out if stages is None or f.stage is None or f.stage in stages]


def failing(findings: list[Finding], strict: bool = False) -> list[Finding]:
    """The findings that make `check` exit 2: errors, and with --strict warnings too."""
    return [f for f in findings if f.severity == "error" or strict]


def summary(findings: list[Finding]) -> dict:
    """`stagewise check --json`: {"findings": [...], "errors": n, "warnings": n}."""
    errors = sum(f.severity == "error" for f in findings)
    return {"findings": [f.model_dump() for f in findings], "errors": errors, "warnings": len(findings) - errors}


def render(findings: list[Finding]) -> str:
    """One line per finding, then the count."""
    counts = summary(findings)
    tail = f"{counts['errors']} error(s), {counts['warnings']} warning(s)" if findings else "no findings"
    return "\n".join([f.line() for f in findings] + [tail])
