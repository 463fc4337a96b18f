"""A doctor's finding: one piece of advice about one recipe field, and how findings are shown.

The rules (training_rules.py, output_rules.py) make them with `advise`; `diagnose` (the doctor's
__init__) adds each one's rule name and file:line; `stagewise check` prints `render` or `summary`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from stagewise.recipe.doctor.facts import Facts

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


def rule_name(rule: Rule) -> str:
    """`finetune_lr` -> `finetune-lr`: how findings and --help name a rule."""
    return rule.__name__.replace("_", "-")


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
