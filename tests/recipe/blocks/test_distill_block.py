"""The `stages.distill` block: the shipped recipe validates and selects, teachers are routed and
built from stages.rl, and a broken block names its field before any work starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.flows.distill import select
from stagewise.flows.registry import registered
from stagewise.recipe import RecipeError, load_recipe
from stagewise.recipe.blocks.distill import DistillStage, TeacherSpec, teacher_rl_block

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"


def problems(*overrides: str) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(TINY, list(overrides))
    return str(info.value)


def test_the_shipped_block_validates_selects_and_borrows_the_rl_prompts():
    recipe = load_recipe(TINY).recipe
    block = select(recipe)
    assert block is not None and registered("distill").start == "handed_on"
    assert block.data == recipe.stages.rl.data  # no data of its own: stages.rl's rows
    assert block.stage.routes() == {"arithmetic": "arithmetic", "format": "format"}
    assert block.stage.loss.temperature == block.stage.rollout.temperature


def test_an_rl_teacher_is_stages_rl_with_its_overrides():
    recipe = load_recipe(TINY).recipe
    spec = TeacherSpec(name="t", domains=["format"], rl={"steps": 4, "rollout": {"temperature": 0.7}})
    rl = teacher_rl_block(spec, recipe.stages.rl)
    assert rl.steps == 4 and rl.rollout.temperature == 0.7 and rl.loss.temperature == 0.7  # follows the rollout
    assert rl.rollout.group_size == recipe.stages.rl.rollout.group_size  # the rest is stages.rl's
    assert rl.data == recipe.stages.rl.data
    with pytest.raises(ValueError, match="starts from the recipe's stages.rl block"):
        teacher_rl_block(spec, None)


def _stage(**kw) -> dict:
    base = {"steps": 2, "teachers": [{"name": "a", "domains": ["arithmetic"], "checkpoint": "ck"}]}
    return {**base, **kw}


@pytest.mark.parametrize("fields, message", [
    ({"teachers": [{"name": "a", "domains": ["x"]}]}, "give exactly one of checkpoint, stage, rl (got none)"),
    ({"teachers": [{"name": "a", "domains": ["x"], "stage": "rl", "checkpoint": "c"}]}, "got checkpoint, stage"),
    ({"teachers": [{"name": "a", "domains": ["x"], "stage": "rl"}, {"name": "b", "domains": ["x"], "stage": "sft"}]},
     "domain 'x' has two teachers (a, b)"),
    ({"teachers": [{"name": "a", "domains": ["x"], "stage": "rl"}, {"name": "a", "domains": ["y"], "stage": "sft"}]},
     "teacher names must be unique"),
    ({"default_teacher": "zz"}, "default_teacher 'zz' is not a teacher"),
    ({"rounds": 2}, "every teacher needs an `rl` block (a has none)"),
    ({"loss": {"kl_coeff": 0.1}}, "the distillation signal is already a KL"),
    ({"teacher_backend": "vllm"}, "teachers a need a `url`"),
])
def test_inconsistent_blocks_are_refused(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("`", ".")):
        DistillStage.model_validate(_stage(**fields))


def test_recipe_checks_name_the_field():
    assert "stages.distill.teachers[1].rl.steps" in problems("stages.distill.teachers[1].rl={steps: 0}")
    text = problems("stages.distill.teachers[1]={name: format, domains: [format], stage: quantize}")
    assert "stages.distill.teachers[1].stage" in text and "runs before distill" in text
    assert "unknown stage 'rll'" in problems("stages.distill.teachers[1]={name: format, domains: [format], stage: rll}")
    assert "stages.distill.student" in problems("stages.distill.student=distill")
    assert "stages.distill.eval_suite" in problems("stages.distill.eval_suite=chatt")
    assert "stages.distill.data: required without a stages.rl block" in problems("stages.rl=null")
