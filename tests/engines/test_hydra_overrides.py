"""Hydra override text: what run_recipe.py (Megatron-Bridge) and NeMo RL's examples parse.

The quoted-string cases below were parsed back with hydra-core 1.3.2's OverridesParser and
resolved with OmegaConf 2.3 (Megatron-Bridge's pins) to exactly the original text; hydra-core
cannot join our install (it needs omegaconf < 2.4, modelopt brings 2.4), so the expected
renderings are written out here."""

from __future__ import annotations

import pytest

from stagewise.engines.hydra_overrides import hydra_string, hydra_value, override_args


def test_scalars_lists_and_dicts():
    assert [hydra_value(v) for v in (None, True, False, 3, 5e-06, 0.0, "a/b c", [["x"], None])] == [
        "null", "true", "false", "3", "5e-06", "0.0", '"a/b c"', '[["x"],null]']
    assert hydra_value({"packed_sequence_size": 2048, "pad_seq_to_mult": 1}) == \
        "{packed_sequence_size:2048,pad_seq_to_mult:1}"
    with pytest.raises(ValueError, match="finite"):
        hydra_value(float("nan"))
    with pytest.raises(TypeError, match="no Hydra form for object"):
        hydra_value(object())


@pytest.mark.parametrize(("text", "rendered"), [
    ("/runs/r ü/sft/rows", '"/runs/r ü/sft/rows"'),  # not JSON's \u00fc, which Hydra keeps literally
    ('a"b', r'"a\"b"'),
    ("a\\b", '"a\\b"'),  # a backslash before neither a quote nor the end is literal
    ("a\\", '"a\\\\"'),
    ('a\\"b', r'"a\\\"b"'),
    ("x${y}z", r'"x\${y}z"'),  # not an OmegaConf interpolation
    ("it's", '"it\'s"'),
    ("a,b]{}:=", '"a,b]{}:="'),
    ("", '""'),
])
def test_strings_parse_back_to_themselves(text, rendered):
    assert hydra_string(text) == rendered == hydra_value(text)


def test_override_args_keep_order_and_prefixes():
    assert override_args({"dataset.preprocessing": None, "+dataset.preprocessing": {"loss_mode": "assistant"}}) == [
        "dataset.preprocessing=null", '+dataset.preprocessing={loss_mode:"assistant"}']
