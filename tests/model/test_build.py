"""build_hf_config / build_model / load_model: overrides, vocabulary, seeding, `from`."""

import pytest
import torch

from stagewise.model.build import build_hf_config, build_model, check_overrides, load_model
from stagewise.model.config import ModelConfig

VOCAB = 512


def _cfg(**kw):
    return ModelConfig(**({"preset": "tiny"} | kw))


def test_same_seed_same_weights_other_seed_differs():
    a, b, c = (build_model(_cfg(), VOCAB, seed=s) for s in (7, 7, 8))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])


def test_seeding_leaves_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_model(_cfg(), VOCAB, seed=123)
    assert torch.equal(torch.rand(3), expected)


def test_bad_override_names_nearest_key():
    with pytest.raises(ValueError, match=r"hiden_size.*did you mean 'hidden_size'"):
        build_hf_config(_cfg(overrides={"hiden_size": 64}), VOCAB)
    with pytest.raises(ValueError, match="model.mtp.num_heads"):
        check_overrides({"num_nextn_predict_layers": 1})


def test_overrides_apply():
    config = build_hf_config(_cfg(overrides={"hidden_size": 64, "hybrid_override_pattern": "M*-"}), VOCAB)
    assert config.hidden_size == 64 and config.hybrid_override_pattern == "M*-"
    assert config.architectures == ["NemotronHForCausalLM"]
    listed = build_hf_config(_cfg(overrides={"layers_block_type": ["mlp", "moe"]}), VOCAB)
    assert listed.hybrid_override_pattern == "-E"


def test_invalid_pattern_is_a_value_error():
    with pytest.raises(ValueError, match="not a valid NemotronHConfig"):
        build_hf_config(_cfg(overrides={"hybrid_override_pattern": "MX"}), VOCAB)


def test_vocab_rules():
    assert build_hf_config(_cfg(), VOCAB).vocab_size == VOCAB
    with pytest.raises(ValueError, match="no vocab_size was given"):
        build_hf_config(_cfg(), None)
    assert build_hf_config(_cfg(preset="nemotron-3-nano-4b"), 4096).vocab_size == 131072
    with pytest.raises(ValueError, match="vocab_size 131072 but the tokenizer has 200000"):
        build_hf_config(_cfg(preset="nemotron-3-nano-4b"), 200_000)


def test_from_checkpoint_loads_its_weights(tmp_path):
    model = build_model(_cfg(), VOCAB, seed=1)
    model.save_pretrained(tmp_path)
    config = build_hf_config(ModelConfig(**{"from": str(tmp_path)}), VOCAB)
    assert config.vocab_size == VOCAB and config.hybrid_override_pattern == "M*EM-E"
    again = build_model(ModelConfig(**{"from": str(tmp_path)}), VOCAB, seed=99)
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)
    with pytest.raises(ValueError, match="tokenizer has"):
        build_hf_config(ModelConfig(**{"from": str(tmp_path)}), VOCAB + 1)
    assert torch.equal(load_model(tmp_path).model.embeddings.weight, model.model.embeddings.weight)
