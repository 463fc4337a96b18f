"""LoRA: only adapters train, merged model == LoRA model, the merged checkpoint is a plain one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, NemotronHForCausalLM

from stagewise.model.lora import apply_lora, merge_lora, trainable_parameters
from stagewise.model.packed import packed_forward


@pytest.fixture
def lora_model(model_factory):
    model = apply_lora(model_factory(), r=4, alpha=8)
    with torch.no_grad():  # B starts at zero; make the adapters do something
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model.eval()


def test_only_adapters_train(model_factory):
    model = apply_lora(model_factory(), r=4, alpha=8)
    trainable, total = trainable_parameters(model)
    assert 0 < trainable < total / 10
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    targeted = {n.split(".")[-4] for n, _ in model.named_parameters() if "lora_A" in n}  # <module>.lora_A.default.weight
    assert targeted == {"q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "up_proj", "down_proj"}


def test_merged_logits_equal_lora_logits(lora_model, tmp_path):
    ids = torch.randint(3, 256, (2, 24))
    with torch.no_grad():
        lora_logits = lora_model(input_ids=ids).logits
        base_logits = lora_model.get_base_model()(input_ids=ids).logits  # adapters active inside
    merged = merge_lora(lora_model)
    assert type(merged) is NemotronHForCausalLM
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, lora_logits, atol=1e-5, rtol=1e-4)
    assert torch.equal(base_logits, lora_logits)
    merged.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, lora_logits, atol=1e-5, rtol=1e-4)


def test_packed_forward_runs_through_lora(lora_model):
    ids = torch.randint(3, 256, (1, 20))
    seq = torch.zeros_like(ids)
    seq[:, 12:] = 1
    with torch.no_grad():
        alone = lora_model(input_ids=ids[:, 12:]).logits
        torch.testing.assert_close(packed_forward(lora_model, ids, None, seq)[:, 12:], alone, atol=1e-4, rtol=1e-4)


def test_refuses_mamba_out_proj_and_plain_models(model_factory):
    with pytest.raises(ValueError, match="out_proj"):
        apply_lora(model_factory(), target_modules=["out_proj"])
    with pytest.raises(ValueError, match="no LoRA adapters"):
        merge_lora(model_factory())


def _packed_rows(n: int = 32, length: int = 16) -> dict:
    """Packed SFT rows: one conversation per row, every next token supervised."""
    import numpy as np

    ids = np.random.default_rng(0).integers(3, 256, (n, length))
    labels = np.concatenate([ids[:, 1:], np.full((n, 1), -100)], axis=1)
    return {"input_ids": ids, "labels": labels, "position_ids": np.tile(np.arange(length), (n, 1)),
            "seq_idx": np.zeros((n, length), dtype=np.int32)}


def _lora_trainer(model_factory, out_dir, logs, steps=6):
    from stagewise.data.sft_packs import PackedBatches
    from stagewise.model.config import TrainConfig
    from stagewise.model.lora import lora_trainer_class
    from stagewise.model.objectives.sft import SFTObjective

    cfg = TrainConfig(tokens=steps * 64, seq_length=16, global_batch=4, micro_batch=2,
                      optimizer={"lr": 1e-2, "weight_decay": 0.0})
    model = apply_lora(model_factory(), r=4, alpha=8, seed=0)
    return lora_trainer_class()(model, cfg, PackedBatches(_packed_rows(), 4, seed=0), SFTObjective("token"), out_dir,
                                "sft", None, "h", log=logs.extend, progress=False)


def test_lora_trainer_saves_merged_checkpoints_and_resumes_exactly(tmp_path, model_factory):
    from stagewise.model.checkpoint import read_meta

    straight: list = []
    a = _lora_trainer(model_factory, tmp_path / "a", straight)
    final = a.fit().checkpoint
    plain = AutoModelForCausalLM.from_pretrained(final)  # a normal checkpoint: no adapters, no peft
    assert type(plain) is NemotronHForCausalLM and not any("lora" in n for n, _ in plain.named_parameters())
    assert read_meta(final).extra["lora"] is True
    ids = torch.randint(3, 256, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(input_ids=ids).logits, a.model.eval()(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-4)
    base = model_factory()
    assert any(not torch.equal(p, q) for p, q in zip(plain.state_dict().values(), base.state_dict().values()))

    first, second = [], []
    b1 = _lora_trainer(model_factory, tmp_path / "b", first)
    mid = b1.fit(until_tokens=3 * 64).checkpoint
    b2 = _lora_trainer(model_factory, tmp_path / "b", second)
    b2.resume(mid)
    b2.fit()
    losses = [m["train/lm_loss"] for _, _, m in first + second]
    assert losses == pytest.approx([m["train/lm_loss"] for _, _, m in straight], abs=1e-5)
    with pytest.raises(ValueError, match="no trainer_state|no LoRA adapter state"):
        from stagewise.model.checkpoint import CheckpointMeta, save_checkpoint

        plain_ckpt = save_checkpoint(tmp_path / "plain", model_factory(), None, CheckpointMeta("sft", 1, 1, "h"))
        _lora_trainer(model_factory, tmp_path / "c", []).resume(plain_ckpt)
