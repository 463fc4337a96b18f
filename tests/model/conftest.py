"""Fixtures for the model library's tests: a tiny NemotronH and a toy batch source.

Tests get the helpers through the fixtures below, never `import conftest`.

The model is built from NemotronHConfig directly (every layer type once: Mamba-2,
attention, MoE with 4 experts top-2, MLP) so these tests do not depend on presets.
"""

from __future__ import annotations

import pytest
import torch
from transformers import NemotronHConfig, NemotronHForCausalLM
from transformers.utils import logging as hf_logging

VOCAB = 256


def tiny_config(pattern: str = "M*E-") -> NemotronHConfig:
    cfg = NemotronHConfig(
        vocab_size=VOCAB, hidden_size=64, hybrid_override_pattern=pattern,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1, chunk_size=16,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        moe_shared_expert_intermediate_size=64, max_position_embeddings=512, use_cache=False,
    )
    cfg.architectures = ["NemotronHForCausalLM"]
    return cfg


def make_model(seed: int = 0, pattern: str = "M*E-") -> NemotronHForCausalLM:
    hf_logging.set_verbosity_error()  # the "mamba_ssm not installed" fallback notice
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return NemotronHForCausalLM(tiny_config(pattern))


class ToyBatches:
    """Deterministic learnable batches (arithmetic progressions mod VOCAB) that implement
    the loader protocol: next_batch / state_dict / load_state_dict. Batch i depends only on
    (seed, i), so restoring `i` restores the data position exactly."""

    def __init__(self, global_batch: int, seq_length: int, seed: int = 0, limit: int | None = None):
        self.global_batch, self.seq_length, self.seed, self.limit = global_batch, seq_length, seed, limit
        self.i = 0

    def next_batch(self) -> torch.Tensor:
        if self.limit is not None and self.i >= self.limit:
            raise StopIteration("toy data exhausted")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.i)
        self.i += 1
        start = torch.randint(0, VOCAB, (self.global_batch, 1), generator=g)
        stride = torch.randint(1, 4, (self.global_batch, 1), generator=g)
        t = torch.arange(self.seq_length + 1).unsqueeze(0)
        return (start + stride * t) % VOCAB

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, state: dict) -> None:
        self.i = int(state["i"])


@pytest.fixture
def tiny_model() -> NemotronHForCausalLM:
    return make_model()


@pytest.fixture
def model_factory():
    """make_model(seed=0, pattern="M*E-"): a fresh tiny model (fixtures, not imports, so the
    helpers work under any pytest import mode)."""
    return make_model


@pytest.fixture
def batches_factory():
    """ToyBatches(global_batch, seq_length, seed=0, limit=None)."""
    return ToyBatches


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A saved PreTrainedTokenizerFast (word-level, VOCAB ids) that AutoTokenizer loads."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|pad|>": 0, "<|bos|>": 1, "<|eos|>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|eos|>")
    out = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread for these tiny tensors. Thread hand-offs cost more than they save
    here, and on a shared 2-core machine with busy neighbours two OpenMP threads made a
    tiny training step up to 75x slower (measured: 145 vs 11,000 tokens/s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
