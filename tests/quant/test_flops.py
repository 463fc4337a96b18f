"""Per-token FLOPs of NemotronH's quantizable operators and their cost per format."""

import pytest
from torch import nn

from stagewise.model.build import build_model
from stagewise.model.config import ModelConfig
from stagewise.quant.flops import format_cost, operator_flops


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(preset="tiny"), 4096, 0)  # hidden 128, 8 experts top-2


def test_linear_flops():
    net = nn.Sequential(nn.Linear(3, 5))
    assert operator_flops(net, ["0"]) == {"0": 2 * 3 * 5}


def test_tiny_model_operators(model):
    names = ["model.layers.1.mixer.q_proj", "model.layers.2.mixer.experts",
             "model.layers.2.mixer.shared_experts.up_proj", "lm_head"]
    assert operator_flops(model, names) == {
        "model.layers.1.mixer.q_proj": 2 * 128 * 128,
        # up/down [8, 128, 128] each; a token runs 2 of the 8 experts
        "model.layers.2.mixer.experts": 2 * (8 * 128 * 128 * 2) * 2 / 8,
        "model.layers.2.mixer.shared_experts.up_proj": 2 * 128 * 256,
        "lm_head": 2 * 128 * 4096,
    }


@pytest.mark.parametrize("name,why", [("model.layers.9.mixer.q_proj", "no such module"),
                                      ("model.layers.2.mixer.gate", "NemotronHTopkRouter")])
def test_unknown_or_unquantizable_name(model, name, why):
    with pytest.raises(ValueError, match=why) as e:
        operator_flops(model, [name])
    assert name in str(e.value)


def test_format_cost():
    assert [format_cost(100.0, f) for f in ("bf16", "fp8", "nvfp4")] == [100.0, 50.0, 25.0]
    with pytest.raises(ValueError, match="int8"):
        format_cost(1.0, "int8")
