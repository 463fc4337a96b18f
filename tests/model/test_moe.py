"""RoutingMonitor and the MoE health formulas of ALGORITHMS.md §9."""

import json

import pytest
import torch

from stagewise.model.build import build_model
from stagewise.model.config import ModelConfig
from stagewise.model.moe import RoutingMonitor, load_balancing_loss, max_violation

VOCAB = 256
E, K = 8, 2  # tiny: 8 routed experts, top-2; MoE layers 2 and 5


@pytest.fixture
def model():
    return build_model(ModelConfig(preset="tiny"), VOCAB, seed=0)


def _ids(seed=0, b=2, t=16):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _force(model, experts):
    """Route every token of every MoE layer to `experts` via the correction bias."""
    for block in model.model.layers:
        if block.block_type == "moe":
            bias = torch.zeros(E)
            bias[list(experts)] = 10.0
            block.mixer.gate.e_score_correction_bias.copy_(bias)


def test_max_violation_example():
    assert max_violation([120, 80, 100, 0, 140, 60, 90, 50]) == 0.75
    assert max_violation([5, 5, 5]) == 0.0 and max_violation([0, 0]) == 0.0


def test_lb_loss_is_one_when_uniform_and_larger_when_skewed():
    t = 64
    uniform = load_balancing_loss(torch.zeros(t, E), torch.full((E,), t * K // E), K)
    assert uniform.item() == pytest.approx(1.0, abs=1e-6)
    logits = torch.full((t, E), -4.0)
    logits[:, :2] = 4.0
    skewed = load_balancing_loss(logits, torch.tensor([t, t, 0, 0, 0, 0, 0, 0]), K)
    assert skewed.item() > 3.0


def test_monitor_lb_loss_one_under_uniform_router_and_differentiable(model):
    mon = RoutingMonitor(model)
    assert sorted(mon.routers) == [2, 5]
    with torch.no_grad():
        for r in mon.routers.values():
            r.weight.zero_()  # every expert scores sigmoid(0): P uniform whatever the counts
    model(_ids())
    assert mon.lb_loss().item() == pytest.approx(1.0, abs=1e-6)
    mon.clear()
    with torch.no_grad():
        for r in mon.routers.values():
            r.weight.normal_(std=0.5)
    model(_ids(1))
    loss = mon.lb_loss()
    assert loss.item() > 1.0
    loss.backward()
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in mon.routers.values())


def test_step_counts_sum_micro_batches_and_skip_no_grad(model):
    mon = RoutingMonitor(model)
    for seed in (0, 1):
        model(_ids(seed))
        mon.lb_loss()
        mon.clear()
    with torch.no_grad():
        model(_ids(2))  # evaluation forward: not counted
    metrics = mon.step_metrics()
    assert set(metrics) == {f"moe/layer{i}/{m}" for i in (2, 5) for m in ("max_vio", "dead_experts")}
    for idx in (2, 5):
        assert sum(mon.last_loads[idx]) == 2 * 2 * 16 * K
        assert metrics[f"moe/layer{idx}/max_vio"] == pytest.approx(max_violation(mon.last_loads[idx]))
    assert mon.lb_loss().item() == 0.0  # nothing recorded since the step closed


def _step(model, mon, experts):
    _force(model, experts)
    model(_ids())
    return mon.step_metrics()


def test_dead_experts_over_a_rolling_window(model):
    mon = RoutingMonitor(model, window=2)
    assert _step(model, mon, [0, 1])["moe/layer2/dead_experts"] == 6
    assert _step(model, mon, [2, 3])["moe/layer5/dead_experts"] == 4  # 0-3 used within the window
    assert _step(model, mon, [4, 5])["moe/layer2/dead_experts"] == 4  # 0, 1 fell out of the window
    assert mon.last_loads[2] == [0, 0, 0, 0, 32, 32, 0, 0]


def test_state_dict_resumes_the_window_exactly(model):
    mon = RoutingMonitor(model, window=3)
    _step(model, mon, [0, 1])
    _step(model, mon, [2, 3])
    state = json.loads(json.dumps(mon.state_dict()))
    mon.remove()
    resumed = RoutingMonitor(model)
    resumed.load_state_dict(state)
    assert resumed.window == 3
    assert _step(model, resumed, [4, 5])["moe/layer2/dead_experts"] == 2
    assert _step(model, resumed, [4, 5])["moe/layer2/dead_experts"] == 4  # [0, 1] left the window


def test_checkpoint_recomputation_is_not_counted_twice(model):
    model.activation_checkpointing_enable({"use_reentrant": False})
    model.train()
    mon = RoutingMonitor(model)
    ids = _ids()
    out = model(ids, labels=ids)
    (out.loss + mon.lb_loss()).backward()  # backward re-runs the blocks' forwards
    mon.clear()
    mon.step_metrics()
    assert all(sum(loads) == 2 * 16 * K for loads in mon.last_loads.values())
    assert mon.routers[2].weight.grad.abs().sum() > 0
