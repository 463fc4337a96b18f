"""Quality tiers weigh sources: a phase's quality_weights become blend weights for the sources it does not name."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
TIERED = "stages.pretrain.phases[1]={name: quality, until: 1.0, blend: {stdlib: 2}, quality_weights: {high: 3, medium: 1}}"


def test_tiers_fill_the_blend_for_unnamed_sources_split_evenly():
    phase = load_recipe(TINY, [TIERED]).recipe.stages.pretrain.phases[1]
    # stdlib named explicitly; facts is the other high source; arithmetic and retrieval share medium; noisy (low) unweighted
    assert phase.blend == {"stdlib": 2.0, "facts": 3.0, "arithmetic": 0.5, "retrieval": 0.5}


def test_relabelling_a_source_moves_its_weight():
    phase = load_recipe(TINY, [TIERED, "data.sources[4].quality=high"]).recipe.stages.pretrain.phases[1]
    assert phase.blend["noisy"] == phase.blend["facts"] == 1.5


def test_tiers_without_sources_are_refused_with_the_path():
    with pytest.raises(RecipeError, match=r"stages.pretrain.phases\[1\].quality_weights: no source has a tier"):
        load_recipe(TINY, ["stages.pretrain.phases[1]={name: q, until: 1.0, quality_weights: {low: 0, high: 0, medium: 0.0}}",
                           "stages.pretrain.phases[1].quality_weights.low=1", "data.sources[4].quality=high"])


def test_a_phase_needs_some_weight():
    with pytest.raises(RecipeError, match="blend weights must not all be zero"):
        load_recipe(TINY, ["stages.pretrain.phases[1]={name: q, until: 1.0}"])
