"""LoRA: only adapters train, merged model == LoRA model, the merged checkpoint is a plain one."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, NemotronHForCausalLM

from model.lora import apply_lora, merge_lora, trainable_parameters
from model.packed import packed_forward


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
