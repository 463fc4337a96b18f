"""AdamW parameter groups: which tensors decay, and that the optimizer steps them."""

import torch

from stagewise.model.config import OptimizerConfig
from stagewise.model.optim import build_optimizer, param_groups


def _names(model, group):
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_no_decay_on_norms_biases_scalars_and_embeddings(tiny_model):
    decay, keep = param_groups(tiny_model, 0.1)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    dec, kept = _names(tiny_model, decay), _names(tiny_model, keep)
    assert dec | kept == {n for n, _ in tiny_model.named_parameters()} and not dec & kept
    assert "model.embeddings.weight" in kept
    assert "model.layers.0.mixer.A_log" in kept and "model.layers.0.mixer.conv1d.bias" in kept
    assert all("norm" not in n for n in dec)
    assert "lm_head.weight" in dec
    assert "model.layers.2.mixer.experts.up_proj" in dec  # stacked 3-d expert weights decay
    assert "model.layers.1.mixer.q_proj.weight" in dec


def test_settings_reach_the_optimizer(tiny_model):
    opt = build_optimizer(tiny_model, OptimizerConfig(lr=1e-3, betas=(0.8, 0.9), eps=1e-7, weight_decay=0.05))
    assert isinstance(opt, torch.optim.AdamW)
    for g in opt.param_groups:
        assert g["betas"] == (0.8, 0.9) and g["eps"] == 1e-7
    assert sorted(g["weight_decay"] for g in opt.param_groups) == [0.0, 0.05]
    assert opt.param_groups[0].get("fused") or opt.param_groups[0].get("foreach")


def test_one_step_changes_every_parameter_with_a_gradient(tiny_model):
    opt = build_optimizer(tiny_model, OptimizerConfig(lr=1e-2))
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    x = torch.randint(0, 256, (2, 17))
    tiny_model(input_ids=x[:, :-1], labels=x[:, :-1]).loss.backward()
    opt.step()
    unchanged = [n for n, p in tiny_model.named_parameters() if p.grad is not None and torch.equal(p, before[n])]
    assert not unchanged
