"""The registry is the pipeline's table of contents: every stage block the recipe has, in design order."""

from __future__ import annotations

import inspect

from stagewise.recipe import STAGE_ORDER, StagesConfig, load_recipe
from stagewise.flows.registry import REGISTRY, registered
from stagewise.flows.stage import StageContext, Upstream


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
