"""What an ablation runs: one stage of a recipe, several variants, each a validated recipe.

    stagewise ablate recipes/tiny.yaml --stage sft --from CKPT \\
        --variant with_format --variant no_format:stages.sft.stages[0].blend.weights.format=0

A variant is a name and `--set` overrides (none: the recipe as it is, the baseline). Every
variant runs the same stage from the same start (`--from`, else `model.from`) with a smaller
training budget (`budget`, a fraction of the stage's tokens or steps: small-model ablations
are the point), unless the variant's own overrides set the budget: they are applied last.
All variants are loaded and validated here, before Prefect starts, so a typo in the third
variant exits 2 naming that variant and the field, and no variant has trained.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from stagewise.flows.registry import REGISTRY, registered
from stagewise.recipe import LoadedRecipe, Recipe, RecipeError, load_recipe

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
DEFAULT_BUDGET = 0.25
"""Variants train a quarter of the stage's budget unless told otherwise (--budget 1 for all of it)."""


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...] = ()


@dataclass
class AblationPlan:
    """The validated ablation: the stage, its start, and each variant's loaded recipe."""

    stage: str
    budget: float
    start: str | None
    variants: list[Variant]
    loaded: dict[str, LoadedRecipe] = field(default_factory=dict)

    def recipe(self, name: str) -> Recipe:
        return self.loaded[name].recipe


def parse_variants(texts: list[str]) -> list[Variant]:
    """`NAME` or `NAME:KEY=VALUE` (repeat a name to give it several overrides), in first-seen order."""
    order: dict[str, list[str]] = {}
    for text in texts:
        name, _, override = text.partition(":")
        name = name.strip()
        if not NAME.match(name):
            raise RecipeError([f"--variant {text!r}: the name {name!r} must be letters, digits, '_', '.' or '-' "
                               "(write NAME or NAME:KEY=VALUE)"])
        if override and "=" not in override:
            raise RecipeError([f"--variant {text!r}: the override {override!r} is not KEY=VALUE"])
        order.setdefault(name, []).extend([override.strip()] if override.strip() else [])
    if len(order) < 2:
        raise RecipeError([f"--variant: an ablation compares at least two variants (got {len(order)}: "
                           f"{', '.join(order) or 'none'})"])
    return [Variant(n, tuple(o)) for n, o in order.items()]


def budget_overrides(recipe: Recipe, stage: str, fraction: float) -> list[str]:
    """The `--set` overrides that give `stage` `fraction` of its training budget: none at 1.0, else
    what its recipe block declares (`budget_overrides`, recipe/blocks/contract.py; none for merge and
    quantize, which do not train)."""
    if fraction == 1.0:
        return []
    return getattr(recipe.stages, stage).budget_overrides(f"stages.{stage}", fraction, recipe)


def ablatable() -> list[str]:
    """Stages an ablation can run alone: those that read no other stage's result in the same run."""
    return [s.name for s in REGISTRY if not s.needs]


def _check_alone(block, stage: str) -> None:
    """A block that names earlier stages' results (distillation's `student: sft`, `stage:` teachers):
    alone, they are not there."""
    named = block.results_named(f"stages.{stage}") if hasattr(block, "results_named") else []
    if named:
        raise RecipeError([f"--stage {stage}: an ablation runs the stage alone, without the earlier stages these name; "
                           f"give them as checkpoint directories (--set ...student=DIR, teachers[i]={{..., checkpoint: DIR}}) "
                           f"or as --from: {'; '.join(named)}"])


def _check_stage(base: LoadedRecipe, stage: str, start: str | None) -> str | None:
    if stage not in ablatable():
        needing = [s for s in REGISTRY if s.needs]
        raise RecipeError([f"--stage {stage!r}: an ablation runs one stage alone; choose one of "
                           f"{', '.join(ablatable())} ({' and '.join(s.name for s in needing)} read "
                           f"{' and '.join(dict.fromkeys(n for s in needing for n in s.needs))}'s results)"])
    if getattr(base.recipe.stages, stage) is None:
        raise RecipeError([f"--stage {stage}: the recipe {base.path} has no stages.{stage} block"])
    _check_alone(getattr(base.recipe.stages, stage), stage)
    if registered(stage).start != "handed_on":
        return None
    start = start or base.recipe.model.from_
    if start is None or not (Path(start) / "config.json").is_file():
        raise RecipeError([f"--from: stages.{stage} starts from a checkpoint; pass --from DIR (a checkpoint directory) "
                           f"or set model.from (got {start!r})"])
    return str(Path(start).resolve())


def plan_ablation(path: str | Path, stage: str, variants: list[str], overrides: list[str] = (),
                  budget: float = DEFAULT_BUDGET, start: str | None = None) -> AblationPlan:
    """Parse and validate everything an ablation needs; RecipeError (exit 2) naming the variant otherwise."""
    if not 0 < budget <= 1:
        raise RecipeError([f"--budget {budget}: a fraction of the stage's budget in (0, 1]"])
    parsed = parse_variants(variants)
    base = load_recipe(path, list(overrides))
    start = _check_stage(base, stage, start)
    common = [*overrides, *budget_overrides(base.recipe, stage, budget)]
    if start is not None:
        common.append(f"model.from={json.dumps(start)}")
    plan = AblationPlan(stage=stage, budget=budget, start=start, variants=parsed)
    for v in parsed:
        try:
            plan.loaded[v.name] = load_recipe(path, [*common, *v.overrides])
        except RecipeError as e:
            raise RecipeError([f"--variant {v.name}: {p}" for p in e.problems]) from None
    return plan
