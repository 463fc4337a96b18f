"""MTP heads: losses per head, target alignment, gradients, and the save/load round trip."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from stagewise.model.build import build_model, load_model
from stagewise.model.config import ModelConfig
from stagewise.model.mtp import MTPHeads

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(preset="tiny", mtp={"num_heads": 2, "loss_weight": 0.5}), VOCAB, seed=0)


def _batch(seed=0, t=24):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(3, VOCAB, (2, t + 1), generator=g)
    return seq[:, :-1], seq[:, 1:].clone()


def _losses(model, ids, labels):
    hidden = model.model(ids).last_hidden_state
    return model.mtp.losses(hidden, ids, labels, model)


def test_attached_as_submodule(model):
    assert isinstance(model.mtp, MTPHeads) and model.mtp.num_heads == 2 and model.mtp.loss_weight == 0.5
    assert any(k.startswith("mtp.heads.1.") for k in model.state_dict())
    assert model.config.num_nextn_predict_layers == 2


def test_losses_one_finite_scalar_per_head_and_grads_reach_heads(model):
    ids, labels = _batch()
    losses = _losses(model, ids, labels)
    assert len(losses) == 2 and all(loss.ndim == 0 and torch.isfinite(loss) for loss in losses)
    assert all(abs(loss.item() - torch.log(torch.tensor(VOCAB)).item()) < 1.0 for loss in losses)  # near uniform at init
    model.zero_grad()
    model.mtp.weighted(losses).backward()
    for name, p in model.mtp.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_head_k_targets_labels_from_k_on(model):
    ids, labels = _batch(1)
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state
        base = model.mtp.losses(hidden, ids, labels, model)
        first = labels.clone()
        first[:, 0] = (first[:, 0] + 1) % VOCAB  # the trunk's target only: no head sees it
        assert all(torch.equal(a, b) for a, b in zip(base, model.mtp.losses(hidden, ids, first, model)))
        second = labels.clone()
        second[:, 1] = (second[:, 1] + 1) % VOCAB  # head 1's first target, beyond head 2's reach
        changed = model.mtp.losses(hidden, ids, second, model)
        assert not torch.equal(changed[0], base[0]) and torch.equal(changed[1], base[1])


def test_masked_targets_and_short_sequences(model):
    ids, labels = _batch(2, t=3)
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state
        masked = model.mtp.losses(hidden, ids, torch.full_like(labels, -100), model)
        assert [loss.item() for loss in masked] == [0.0, 0.0]
        short = model.mtp.losses(hidden[:, :2], ids[:, :2], labels[:, :2], model)
        assert torch.isfinite(short[0]) and short[1].item() == 0.0


def test_save_then_hf_loads_ignoring_mtp_and_load_model_restores(model, tmp_path):
    model.save_pretrained(tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not hasattr(plain, "mtp")
    ids, _ = _batch(3)
    model.eval()
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, model(ids).logits)
    restored = load_model(tmp_path)  # no stagewise.json: settings from config.json
    assert restored.mtp.num_heads == 2 and restored.mtp.loss_weight == 0.3
    for (name, a), b in zip(model.mtp.state_dict().items(), restored.mtp.state_dict().values()):
        assert torch.equal(a, b), name
    (tmp_path / "stagewise.json").write_text(json.dumps({"stage": "pretrain", "mtp": {"num_heads": 2, "loss_weight": 0.7}}))
    assert load_model(tmp_path).mtp.loss_weight == 0.7
    model.train()


def test_from_checkpoint_keeps_or_replaces_heads(model, tmp_path):
    model.save_pretrained(tmp_path)
    same = build_model(ModelConfig(**{"from": str(tmp_path), "mtp": {"num_heads": 2}}), VOCAB, seed=5)
    assert torch.equal(same.mtp.heads[0].proj.weight, model.mtp.heads[0].proj.weight)
    one = build_model(ModelConfig(**{"from": str(tmp_path), "mtp": {"num_heads": 1}}), VOCAB, seed=5)
    assert one.mtp.num_heads == 1 and one.config.num_nextn_predict_layers == 1
    none = build_model(ModelConfig(**{"from": str(tmp_path)}), VOCAB, seed=5)
    assert not hasattr(none, "mtp") and none.config.num_nextn_predict_layers == 0
