"""The registry is the pipeline's table of contents: every stage block the recipe has, in design order."""

from __future__ import annotations

import inspect
import typing

import pytest

from stagewise.config_base import StrictConfig
from stagewise.eval.gates import GateConfig
from stagewise.flows.registry import REGISTRY, problems, registered
from stagewise.flows.stage import Stage, StageContext, Upstream
from stagewise.recipe import STAGE_ORDER, StagesConfig, load_recipe
from stagewise.recipe.blocks.contract import Role, Stretch, missing_hooks
from stagewise.recipe.schema import stage_blocks
from stagewise.recipe.shipped import resolve_recipe, shipped_names


def test_every_recipe_stage_block_has_a_registered_stage_in_order():
    assert [s.name for s in REGISTRY] == [n for n in STAGE_ORDER if n in StagesConfig.model_fields]


def test_every_stage_flow_has_the_contract_signature():
    for entry in REGISTRY:
        params = list(inspect.signature(entry.flow.fn).parameters.values())
        assert [p.name for p in params] == ["ctx", "block", "upstream"], entry.name
        assert params[0].annotation in (StageContext, "StageContext")
        assert "Upstream" in str(params[2].annotation)
        assert entry.flow.name == entry.name  # the Prefect flow is named after its stage


def test_select_gives_a_stage_only_its_block_and_what_it_reads():
    from pathlib import Path

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml").recipe
    for entry in REGISTRY:
        block = entry.select(recipe)
        assert block is not None and block.stage == getattr(recipe.stages, entry.name), entry.name
        assert "stages" not in type(block).model_fields  # never the whole recipe
    assert registered("merge").needs == ("pretrain",) and registered("sft").start == "handed_on"
    assert Upstream().last() is None


def test_the_pipelines_table_of_contents_lists_every_registered_stage_in_order():
    """flows/pipeline.py's docstring is the chain a newcomer reads first: it must not fall behind."""
    import re

    from stagewise.flows import pipeline

    listed = re.findall(r"[├└]─ (\w+)", pipeline.__doc__)
    assert listed == [s.name for s in REGISTRY]


def test_every_registered_stage_declares_what_the_ablation_planner_and_the_doctor_read():
    """A registered stage whose block lacks a hook (e.g. no budget_overrides: an ablation could not
    scale it) fails here, before any ablation or `stagewise check` meets it."""
    assert problems() == []
    assert registered("quantize").hands_on == "export" and registered("merge").hands_on == "checkpoint"
    assert all(entry.recipe_block is stage_blocks()[entry.name] for entry in REGISTRY)


@pytest.mark.parametrize("name", shipped_names())
def test_each_shipped_blocks_hooks_answer(name):
    """On every shipped recipe, each present block's hooks give what their callers read."""
    recipe = load_recipe(resolve_recipe(name)).recipe
    for entry in REGISTRY:
        block, at = getattr(recipe.stages, entry.name), f"stages.{entry.name}"
        if block is None:
            continue
        stretches = list(block.stretches(at))
        assert all(isinstance(s, Stretch) and s.at.startswith(at) for s in stretches), entry.name
        assert all(s.block.optimizer.lr > 0 and s.role in typing.get_args(Role) for s in stretches), entry.name
        overrides = block.budget_overrides(at, 0.5, recipe)
        assert all(o.startswith(f"{at}.") and "=" in o for o in overrides), entry.name
        assert bool(overrides) == bool(stretches), entry.name  # what trains has a budget to scale; the rest none
        for s in stretches:
            if s.gate is not None:
                assert isinstance(block.gate_metrics(recipe), set), entry.name


class _DPOStage(StrictConfig):
    """A new stage's block half written: it says what it trains but not how an ablation scales it,
    and it can hold a gate without saying what its evaluations log."""

    steps: int = 10
    gate: GateConfig | None = None

    def stretches(self, at: str):
        yield Stretch(at, self, "finetune")


def test_an_incomplete_stage_is_reported():
    """The check above can fail: a fake entry whose block lacks hooks, which needs a stage that does not
    run before it and starts from quantize's export, is reported on each count."""
    fake = Stage(name="dpo", flow=lambda ctx, block, upstream: None, select=lambda recipe: None,
                 needs=("reward_model",), start="handed_on")
    found = problems((*REGISTRY, fake), blocks={"dpo": _DPOStage})
    assert any("dpo" in p and "budget_overrides" in p for p in found), found
    assert any("dpo" in p and "gate_metrics" in p for p in found), found
    assert any("dpo" in p and "reward_model" in p for p in found), found
    assert any("dpo" in p and "quantize hands on" in p for p in found), found
    assert not any(p.startswith(tuple(f"{s.name}:" for s in REGISTRY)) for p in found), found
    assert missing_hooks(_DPOStage) == ["budget_overrides", "gate_metrics"]
    assert problems((Stage(name="nameless", flow=fake.flow, select=fake.select),)) == [
        "nameless: no recipe block (add its field to StagesConfig in recipe/schema.py)"]
