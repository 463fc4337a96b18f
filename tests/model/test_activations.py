"""ActivationMonitor: per-block residual RMS, only on enabled steps."""

import pytest
import torch

from stagewise.model.activations import ActivationMonitor
from stagewise.model.build import build_model
from stagewise.model.config import ModelConfig

VOCAB = 256


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(preset="tiny"), VOCAB, seed=0)


def _ids(seed):
    return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))


def _block_outputs(model, ids):
    """Each block's output: hidden_states[i + 1], except the last (replaced by norm_f's output)."""
    with torch.no_grad():
        hs = model.model(ids, output_hidden_states=True).hidden_states
        last = model.model.layers[-1](hs[-2])  # tiny's last block is MoE: no mask or positions needed
    return [*hs[1:-1], last]


def _rms(*xs):
    return (sum(x.double().pow(2).sum() for x in xs) / sum(x.numel() for x in xs)).sqrt().item()


def test_disabled_measures_nothing(model):
    mon = ActivationMonitor(model)
    model(_ids(0))
    assert mon.metrics() == {}
    mon.remove()


def test_rms_matches_manual_over_micro_batches(model):
    a, b = _block_outputs(model, _ids(0)), _block_outputs(model, _ids(1))
    mon = ActivationMonitor(model)
    mon.enabled = True
    with torch.no_grad():
        model(_ids(0))
        model(_ids(1))
    got = mon.metrics()
    mon.remove()
    assert list(got) == [f"act/layer{i}/rms" for i in range(6)]
    for i in range(6):
        assert got[f"act/layer{i}/rms"] == pytest.approx(_rms(a[i], b[i]), rel=1e-5)
    assert mon.metrics() == {}  # reset after reading
    assert len({round(v, 4) for v in got.values()}) > 1  # layers differ: not one global number
