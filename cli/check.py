"""`stagewise check`: the recipe doctor, published guidance checked against a recipe before any work.

The rules are recipe/doctor/training_rules.py and recipe/doctor/output_rules.py; this command loads the recipe,
prints the findings (or `--json`) and exits 2 on an error (`--strict`: on a warning too).
`stagewise run` runs the same doctor first and refuses errors unless `--force`. The help text
lists every rule from its docstring, so it cannot drift from the code.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import typer

from stagewise.cli.options import DebugOpt, JsonOpt, RecipeArg, SetOpt, load
from stagewise.cli.output import emit, guarded
from stagewise.recipe.doctor import rule_name, rules


@guarded
def check_cmd(
    recipe: Path = RecipeArg,
    overrides: list[str] = SetOpt,
    strict: bool = typer.Option(False, "--strict", help="Count warnings as errors: exit 2 on any finding."),
    as_json: bool = JsonOpt,
    debug: bool = DebugOpt,
) -> None:
    from stagewise.recipe.doctor import diagnose, failing, render, summary

    findings = diagnose(load(recipe, overrides))
    emit(summary(findings), as_json, lambda: typer.echo(render(findings)))
    if failing(findings, strict):
        raise typer.Exit(2)


def _rule_lines() -> str:
    """`name: the first paragraph of its docstring`, wrapped, one rule after another."""
    out = []
    for rule in rules():
        first = " ".join((rule.__doc__ or "").split("\n\n")[0].split())
        out += textwrap.wrap(f"{rule_name(rule)}: {first}", width=96, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(out)


check_cmd.__doc__ = f"""Check a recipe against published training guidance: what is legal but likely wrong.

A recipe that loads is valid (the schema and cross-field rules); the doctor judges what it asks
for against published Nemotron settings, scaled to the model (`stagewise inspect` counts its
parameters) and to its data once prepared under the workdir (`stagewise data prepare`). Each
finding is a warning or an error with its number, the field and its file:line, and the source
of the advice. Exit 0 without errors (warnings printed), 2 on any error (--strict: any
finding). `stagewise run` runs the same checks first and refuses errors unless --force.
--json prints {{"findings": [{{rule, severity, field, where, message, value, reference}}],
"errors": n, "warnings": n}}.

\b
Example:
  stagewise check recipes/tiny.yaml
  stagewise check recipes/tiny.yaml --set stages.sft.stages[0].optimizer.lr=5e-3 --json
  stagewise check recipes/nemotron-3-nano-4b.yaml --strict

\b
Rules:
{_rule_lines()}
"""
