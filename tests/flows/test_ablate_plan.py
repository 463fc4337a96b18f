"""flows/ablate_plan.py: variants parse, every variant is validated up front, budgets shrink."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.flows.ablate_plan import budget_overrides, parse_variants, plan_ablation
from stagewise.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
FORMAT_OFF = "stages.sft.stages[0].blend.weights.format=0"


@pytest.fixture
def start(tmp_path) -> str:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    return str(tmp_path / "ckpt")


def test_variants_parse_names_and_repeated_overrides():
    parsed = parse_variants(["base", f"off:{FORMAT_OFF}", "off:stages.sft.stages[1].blend.weights.format=0"])
    assert [(v.name, len(v.overrides)) for v in parsed] == [("base", 0), ("off", 2)]
    assert parsed[1].overrides[0] == FORMAT_OFF


@pytest.mark.parametrize("texts, needle", [(["only"], "at least two"), (["a", "b c"], "name"),
                                           (["a", "b:novalue"], "KEY=VALUE")])
def test_bad_variants_exit_2(texts, needle):
    with pytest.raises(RecipeError, match=needle):
        parse_variants(texts)


def test_plan_scales_every_sub_stage_and_keeps_the_variant_override(start):
    plan = plan_ablation(TINY, "sft", ["base", f"off:{FORMAT_OFF}"], budget=0.1, start=start)
    full = load_recipe(TINY).recipe.stages.sft.stages
    for name in ("base", "off"):
        subs = plan.recipe(name).stages.sft.stages
        for sub, orig in zip(subs, full):
            assert sub.tokens % sub.tokens_per_step == 0 and sub.tokens < orig.tokens
            assert abs(sub.tokens - 0.1 * orig.tokens) <= sub.tokens_per_step
            assert sub.schedule.warmup_tokens < sub.tokens
        assert plan.recipe(name).model.from_ == str(Path(start).resolve())
    assert plan.recipe("off").stages.sft.stages[0].blend.weights["format"] == 0
    assert plan.recipe("base").stages.sft.stages[0].blend.weights["format"] == full[0].blend.weights["format"]
    # a gate's targets are the whole budget's: a variant at a tenth of it trains without (tiny gates stage 1)
    assert full[0].gate is not None and all(s.gate is None for s in plan.recipe("base").stages.sft.stages)
    assert plan_ablation(TINY, "sft", ["a", "b"], budget=1.0, start=start).recipe("a").stages.sft.stages[0].gate


def test_a_variant_sets_its_own_budget(start):
    plan = plan_ablation(TINY, "sft", ["base", "long:stages.sft.stages[0].tokens=409600"], budget=0.1, start=start)
    assert plan.recipe("long").stages.sft.stages[0].tokens == 409600
    assert plan.recipe("base").stages.sft.stages[0].tokens < 409600


def test_step_budgets_for_rl_and_distill():
    recipe = load_recipe(TINY).recipe
    rl = dict(o.split("=") for o in budget_overrides(recipe, "rl", 0.5))
    assert rl["stages.rl.steps"] == str(recipe.stages.rl.steps // 2)
    distill = dict(o.split("=") for o in budget_overrides(recipe, "distill", 0.5))
    assert distill["stages.distill.steps"] == str(recipe.stages.distill.steps // 2)
    teacher = recipe.stages.distill.teachers[1].rl["steps"]  # [0] is a stage teacher: no budget of its own
    assert distill["stages.distill.teachers[1].rl.steps"] == str(round(teacher / 2))
    assert not any("teachers[0]" in k for k in distill)
    assert budget_overrides(recipe, "quantize", 0.5) == [] and budget_overrides(recipe, "sft", 1.0) == []


def test_a_bad_variant_is_named_before_any_work(start):
    with pytest.raises(RecipeError) as err:
        plan_ablation(TINY, "sft", ["base", "typo:stages.sft.stages[0].blend.wieghts.format=0"], start=start)
    assert "--variant typo" in str(err.value) and "wieghts" in str(err.value)


@pytest.mark.parametrize("stage, needle", [("merge", "one stage alone"), ("long_context", "one stage alone")])
def test_stages_that_read_pretraining_cannot_be_ablated_alone(stage, needle, start):
    with pytest.raises(RecipeError, match=needle):
        plan_ablation(TINY, stage, ["a", "b"], start=start)


def test_a_fine_tune_needs_a_start(tmp_path):
    with pytest.raises(RecipeError, match="--from"):
        plan_ablation(TINY, "sft", ["a", "b"])
    with pytest.raises(RecipeError, match="--from"):
        plan_ablation(TINY, "sft", ["a", "b"], start=str(tmp_path))  # no config.json
    with pytest.raises(RecipeError, match="budget"):
        plan_ablation(TINY, "sft", ["a", "b"], budget=0, start=str(tmp_path))


def test_distill_alone_refuses_the_earlier_stages_it_names(start):
    with pytest.raises(RecipeError) as err:
        plan_ablation(TINY, "distill", ["a", "b"], start=start)
    assert "stages.distill.student: sft" in str(err.value) and "stages.distill.teachers[0].stage: rl" in str(err.value)
    plan = plan_ablation(TINY, "distill", ["a", "b"], [f"stages.distill.teachers[0]={{name: arithmetic, domains: "
                                                        f"[arithmetic], checkpoint: {start}}}", "stages.distill.student=null"],
                         budget=0.5, start=start)
    assert plan.recipe("a").stages.distill.steps == round(load_recipe(TINY).recipe.stages.distill.steps / 2)
