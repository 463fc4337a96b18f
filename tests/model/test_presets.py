"""Presets: names, fresh copies, and parameter counts (exact for the published shapes)."""

import pytest

from stagewise.model.config import ModelConfig
from stagewise.model.inspect import inspect_model
from stagewise.model.presets import preset_about, preset_kwargs, preset_names

PUBLISHED = ["nemotron-3-nano-30b-a3b", "nemotron-3-nano-4b", "nemotron-h-8b", "nemotron-nano-9b-v2"]


def test_names_cover_builtins_and_published_files():
    assert preset_names() == ["tiny", "tiny-dense", "small", *PUBLISHED]


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_total_params_exact(name):
    report = inspect_model(ModelConfig(preset=name), None, seq_length=8, micro_batch=1)
    assert report.total_params == preset_about(name)["total_params"]


def test_nano_4b_count_is_the_published_one():
    assert preset_about("nemotron-3-nano-4b")["total_params"] == 3_973_556_832


def test_30b_active_params_match_published():
    report = inspect_model(ModelConfig(preset="nemotron-3-nano-30b-a3b"), None, seq_length=8, micro_batch=1)
    assert report.active_params == preset_about("nemotron-3-nano-30b-a3b")["active_params"] == 3_580_076_352


@pytest.mark.parametrize(("name", "low", "high"), [("tiny", 1e6, 3e6), ("tiny-dense", 1e6, 3e6), ("small", 20e6, 50e6)])
def test_builtin_sizes_at_demo_vocab(name, low, high):
    report = inspect_model(ModelConfig(preset=name), 4096, seq_length=8, micro_batch=1)
    assert low <= report.total_params <= high


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_builtins_set_the_risky_defaults_and_every_layer_type(name):
    kw = preset_kwargs(name)
    assert kw["vocab_size"] is None
    assert kw["max_position_embeddings"] > 4096 and kw["n_routed_experts"] > kw["num_experts_per_tok"]
    assert set(kw["hybrid_override_pattern"]) == set("M*E-")
    assert kw["n_shared_experts"] == 1


def test_tiny_dense_is_tiny_with_an_mlp_for_every_moe_layer():
    """What vLLM's CPU build can serve: no E layer, everything else tiny's (same layer count, same mixers)."""
    tiny, dense = preset_kwargs("tiny"), preset_kwargs("tiny-dense")
    assert "E" not in dense["hybrid_override_pattern"]
    assert dense["hybrid_override_pattern"] == tiny["hybrid_override_pattern"].replace("E", "-")
    assert {k: v for k, v in dense.items() if k != "hybrid_override_pattern"} == {
        k: v for k, v in tiny.items() if k != "hybrid_override_pattern"}


def test_preset_kwargs_is_a_fresh_copy():
    kw = preset_kwargs("nemotron-3-nano-4b")
    kw["hidden_size"] = 1
    assert preset_kwargs("nemotron-3-nano-4b")["hidden_size"] == 3136
    assert "_about" not in kw


def test_unknown_preset_lists_names():
    with pytest.raises(ValueError, match="unknown model preset 'tinyy'.*tiny, tiny-dense, small, nemotron"):
        preset_kwargs("tinyy")
