"""Resume is bit for bit: a run interrupted at a checkpoint and continued by a fresh Trainer
ends with weights and optimizer state `torch.equal` to the uninterrupted run's (CPU, same seed).

Each case trains once straight through with periodic checkpoints (as a killed process would
have left them), then a fresh Trainer over a fresh model, a fresh batch source and a scrambled
process RNG resumes from an intermediate checkpoint and finishes. No tolerance anywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stagewise.model import checkpoint as ck
from stagewise.model.config import TrainConfig
from stagewise.model.objectives import LMObjective
from stagewise.model.objectives.sft import SFTObjective
from stagewise.model.trainer import Trainer

SEQ, GLOBAL = 32, 8
TPS = SEQ * GLOBAL


def cfg_for(steps: int, every_steps: int, **kw) -> TrainConfig:
    kw.setdefault("micro_batch", 4)
    kw.setdefault("optimizer", {"lr": 3e-3, "min_lr": 3e-5})
    kw.setdefault("schedule", {"kind": "wsd", "warmup_tokens": 2 * TPS, "decay_tokens": 3 * TPS})
    return TrainConfig(tokens=steps * TPS, seq_length=SEQ, global_batch=GLOBAL,
                       checkpoint_every_tokens=every_steps * TPS, **kw)


def assert_identical(a: Trainer, b: Trainer) -> None:
    """Every weight, every optimizer state tensor and the optimizer's hyper-parameters equal."""
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert list(sa) == list(sb)
    different = [n for n in sa if not torch.equal(sa[n], sb[n])]
    assert not different, f"weights differ: {different}"
    oa, ob = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    assert sorted(oa["state"]) == sorted(ob["state"])
    for idx, state in oa["state"].items():
        for key, value in state.items():
            other = ob["state"][idx][key]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other, (idx, key)
    assert (a.step, a.tokens_seen) == (b.step, b.tokens_seen)


def scramble_process_state() -> None:
    """A different process: every global generator somewhere else (resume must not depend on them)."""
    import random

    torch.manual_seed(987)
    np.random.seed(987)
    random.seed(987)


def straight_then_resumed(make, steps: int, every: int, resume_at: int, tmp_path, **cfg_kw):
    """(straight trainer, resumed trainer): `make(cfg, out_dir, model_seed)` builds a Trainer."""
    cfg = cfg_for(steps, every, **cfg_kw)
    straight = make(cfg, tmp_path / "straight", 0)
    straight.fit()
    ckpt = tmp_path / "straight" / f"step-{resume_at:08d}"
    assert ckpt.is_dir() and ck.read_meta(ckpt).step == resume_at
    scramble_process_state()
    resumed = make(cfg, tmp_path / "resumed", 7)  # other initial weights: all must come from the checkpoint
    resumed.resume(ckpt)
    resumed.fit()
    return straight, resumed


# ---------------------------------------------------------------- pretraining data path


@pytest.fixture
def pretrain_source(tmp_path):
    """data.loader.PretrainBatches over two small shards, blended in two phases."""
    from types import SimpleNamespace

    from stagewise.data.config import PhaseConfig
    from stagewise.data.loader import PretrainBatches
    from stagewise.data.shards import SourceShards, write_shard

    rng = np.random.default_rng(0)
    sources = {}
    for name, n in (("a", 50), ("b", 30)):
        docs = [np.append((rng.integers(3, 256) + np.arange(rng.integers(20, 80)) * 2) % 253 + 3, 2) for _ in range(n)]
        shard = write_shard(tmp_path / f"shard-{name}", docs, vocab_size=256, eos_id=2)
        sources[name] = SourceShards(shard.path, shard.path, shard.n_tokens, 0, n)
    prepared = SimpleNamespace(digest="toy", sources=sources)
    phases = [PhaseConfig(name="p1", blend={"a": 0.7, "b": 0.3}, until=0.5),
              PhaseConfig(name="p2", blend={"a": 0.2, "b": 0.8})]

    def make(total_tokens: int) -> PretrainBatches:
        return PretrainBatches(prepared, phases, {"a": 100.0, "b": 100.0}, SEQ, GLOBAL, total_tokens, seed=3)

    return make


def test_pretraining_resume_is_bit_identical(tmp_path, model_factory, pretrain_source):
    def make(cfg, out, seed):
        return Trainer(model_factory(seed=seed), cfg, pretrain_source(cfg.tokens), LMObjective(cfg.lb_loss_coeff),
                       out, "pretrain", None, "hash", progress=False)

    # checkpoints at 3, 6, 9 (and 10); resuming at 3 crosses the phase boundary and the decay start
    straight, resumed = straight_then_resumed(make, steps=10, every=3, resume_at=3, tmp_path=tmp_path)
    assert_identical(straight, resumed)
    assert resumed.batches.realized() == straight.batches.realized()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_mtp_and_accumulation_resume_is_bit_identical(tmp_path, model_factory, batches_factory, precision):
    """Two micro-batches per step, an MTP head (its weights ride in the safetensors file), and
    bf16 autocast (fp32 master weights: the checkpoint round trip is exact either way)."""
    from stagewise.model.mtp import attach_mtp

    def make(cfg, out, seed):
        model = model_factory(seed=seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            attach_mtp(model, 1, loss_weight=0.3)
        return Trainer(model, cfg, batches_factory(GLOBAL, SEQ), LMObjective(cfg.lb_loss_coeff), out, "pretrain",
                       None, "hash", progress=False)

    straight, resumed = straight_then_resumed(make, steps=6, every=2, resume_at=4, tmp_path=tmp_path, micro_batch=2,
                                              precision=precision)
    assert_identical(straight, resumed)


def test_long_context_resume_is_bit_identical(tmp_path, model_factory):
    """data.long_context.LongContextBatches: a step is GLOBAL x SEQ tokens of mixed lengths."""
    from stagewise.data.long_context import LongContextBatches
    from stagewise.data.long_context_config import LongContextDataConfig
    from stagewise.data.shards import TokenShard, write_shard

    rng = np.random.default_rng(1)
    shards = {}
    for name, n in (("a", 30), ("b", 20)):
        docs = [np.append((rng.integers(3, 256) + np.arange(rng.integers(20, 140)) * 3) % 253 + 3, 2) for _ in range(n)]
        shards[name] = write_shard(tmp_path / f"lc-{name}", docs, vocab_size=256, eos_id=2).path
    data_cfg = LongContextDataConfig(lengths=[{"length": 2 * SEQ, "share": 0.5}, {"length": SEQ, "share": 0.5}],
                                     global_batch_tokens=TPS, micro_batch_tokens=TPS // 2, lookahead_docs=8)

    def make(cfg, out, seed):
        source = LongContextBatches({k: TokenShard.open(v) for k, v in shards.items()}, data_cfg,
                                    {"a": 0.6, "b": 0.4}, seed=3)
        return Trainer(model_factory(seed=seed), cfg, source, LMObjective(cfg.lb_loss_coeff), out, "long_context",
                       None, "hash", progress=False)

    straight, resumed = straight_then_resumed(make, steps=6, every=2, resume_at=2, tmp_path=tmp_path,
                                              schedule={"kind": "constant"})
    assert_identical(straight, resumed)
    assert resumed.batches.state_dict() == straight.batches.state_dict()


# ---------------------------------------------------------------- packed SFT data path


def packed_rows(n: int = 24, pack: int = SEQ, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows shaped like data/sft_packs.py's: 2-3 conversations per row, the answer half supervised."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((n, pack), np.int64)
    labels = np.full((n, pack), -100, np.int64)
    pos = np.zeros((n, pack), np.int64)
    seq_idx = np.zeros((n, pack), np.int32)
    for r in range(n):
        cuts = sorted(rng.choice(np.arange(6, pack - 6), size=int(rng.integers(1, 3)), replace=False).tolist())
        bounds = [0, *cuts, pack]
        for c, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            a, step = int(rng.integers(3, 200)), int(rng.integers(1, 4))
            ids[r, lo:hi] = (a + step * np.arange(hi - lo)) % 253 + 3
            pos[r, lo:hi] = np.arange(hi - lo)
            seq_idx[r, lo:hi] = c
            mid = (lo + hi) // 2
            labels[r, mid:hi - 1] = ids[r, mid + 1:hi]
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "seq_idx": seq_idx}


@pytest.mark.parametrize("normalization", ["token", "conversation"])
def test_packed_sft_resume_is_bit_identical(tmp_path, model_factory, normalization):
    from stagewise.data.sft_packs import PackedBatches

    rows = packed_rows()

    def make(cfg, out, seed):
        return Trainer(model_factory(seed=seed), cfg, PackedBatches(rows, GLOBAL, seed=5),
                       SFTObjective(normalization, cfg.lb_loss_coeff), out, "sft", None, "hash", progress=False)

    # 24 packs / 8 per step: resuming at step 4 is mid-way through the second epoch's shuffle
    straight, resumed = straight_then_resumed(make, steps=8, every=2, resume_at=4, tmp_path=tmp_path)
    assert_identical(straight, resumed)
    assert resumed.batches.state_dict() == straight.batches.state_dict()


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_lora_resume_is_bit_identical(tmp_path, model_factory, dropout):
    """LoRA dropout draws from the global torch RNG every step: only a restored RNG repeats it."""
    from stagewise.data.sft_packs import PackedBatches
    from stagewise.model.lora import apply_lora, lora_trainer_class

    rows = packed_rows()
    LoRATrainer = lora_trainer_class()

    def make(cfg, out, seed):
        base = model_factory(seed=0)  # the stage's starting checkpoint: the same base for both
        model = apply_lora(base, r=4, alpha=8, dropout=dropout, seed=seed)
        return LoRATrainer(model, cfg, PackedBatches(rows, GLOBAL, seed=5), SFTObjective("token", cfg.lb_loss_coeff),
                           out, "sft", None, "hash", progress=False)

    straight, resumed = straight_then_resumed(make, steps=6, every=2, resume_at=2, tmp_path=tmp_path,
                                              optimizer={"lr": 1e-2, "min_lr": 1e-4})
    assert_identical(straight, resumed)
    # the written (merged) checkpoints are identical too
    final = f"step-{straight.step:08d}"
    assert ck.weights_sha256(tmp_path / "straight" / final) == ck.weights_sha256(tmp_path / "resumed" / final)


def test_resume_under_other_numerics_warns(tmp_path, model_factory, batches_factory, caplog):
    """A checkpoint written under another thread count (or torch build) resumes, with a warning
    that the last bits may differ; the same numerics resume silently."""
    cfg = cfg_for(2, 1)

    def make(out):
        return Trainer(model_factory(), cfg, batches_factory(GLOBAL, SEQ), LMObjective(), out, "pretrain", None,
                       "hash", progress=False)

    make(tmp_path / "a").fit(until_tokens=TPS)
    ckpt = tmp_path / "a" / "step-00000001"
    assert ck.load_trainer_state(ckpt).progress["numerics"]["threads"] == torch.get_num_threads() == 1
    with caplog.at_level("WARNING", logger="stagewise.model.trainer"):
        make(tmp_path / "b").resume(ckpt)
        assert not caplog.records
        torch.set_num_threads(2)  # the autouse fixture puts 1 back
        make(tmp_path / "c").resume(ckpt)
    assert "may differ in the last bits" in caplog.text and "'threads': 1" in caplog.text
