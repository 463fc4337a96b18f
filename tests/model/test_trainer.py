"""The Trainer: metrics, accumulation, schedule, checkpoints, exact resume, divergence."""

import copy
import math

import pytest
import torch

from stagewise.model import checkpoint as ck
from stagewise.model.config import TrainConfig
from stagewise.model.mfu import active_params, flops_per_token, peak_flops
from stagewise.model.objectives import LMObjective, LossContext
from stagewise.model.schedules import lr_at
from stagewise.model.trainer import FitResult, Trainer, TrainingDiverged

SEQ, GLOBAL = 32, 8
TPS = SEQ * GLOBAL  # tokens per step


def train_cfg(steps=8, **kw):
    kw.setdefault("micro_batch", 4)
    kw.setdefault("optimizer", {"lr": 3e-3, "min_lr": 3e-5})
    return TrainConfig(tokens=steps * TPS, seq_length=SEQ, global_batch=GLOBAL, **kw)


def make_trainer(model, cfg, batches, out_dir, logs=None, **kw):
    log = logs.extend if logs is not None else None
    kw.setdefault("progress", False)
    return Trainer(model, cfg, batches, LMObjective(cfg.lb_loss_coeff), out_dir, "pretrain", None, "hash", log=log, **kw)


def test_fit_trains_and_logs_in_batches(tmp_path, tiny_model, batches_factory):
    calls = []
    cfg = train_cfg(steps=12, monitor={"log_every_steps": 4, "act_rms_every_steps": 3})
    trainer = Trainer(tiny_model, cfg, batches_factory(GLOBAL, SEQ), LMObjective(), tmp_path, "pretrain", None,
                      "hash", log=calls.append, progress=False)
    result = trainer.fit()
    assert isinstance(result, FitResult) and result.stop_reason == "budget"
    assert (result.step, result.tokens_seen) == (12, 12 * TPS)
    assert [len(c) for c in calls] == [4, 4, 4]  # one call per 4 steps, never per scalar
    rows = [r for c in calls for r in c]
    assert [(s, t) for s, t, _ in rows] == [(i, i * TPS) for i in range(1, 13)]
    first, last = rows[0][2], rows[-1][2]
    for name in ("train/lm_loss", "train/lb_loss", "train/grad_norm", "train/params_norm", "train/num_zeros",
                 "train/lr", "train/tokens_per_s", "train/mfu", "moe/layer2/max_vio", "moe/layer2/dead_experts"):
        assert name in last and math.isfinite(last[name]), name
    assert last["train/lm_loss"] < first["train/lm_loss"] - 0.5
    assert 0.9 < first["train/lb_loss"] < 1.5  # ~1 near uniform routing
    acts = [s for s, _, m in rows if "act/layer0/rms" in m]
    assert acts == [3, 6, 9, 12] and all(f"act/layer{i}/rms" in rows[2][2] for i in range(4))
    assert 0 < last["train/mfu"] < 1
    assert result.checkpoint == tmp_path / "step-00000012" and ck.latest_checkpoint(tmp_path) == result.checkpoint


def test_lr_follows_the_schedule_at_each_steps_start_tokens(tmp_path, tiny_model, batches_factory):
    logs = []
    cfg = train_cfg(steps=6, schedule={"kind": "wsd", "warmup_tokens": 2 * TPS, "decay_tokens": 2 * TPS})
    make_trainer(tiny_model, cfg, batches_factory(GLOBAL, SEQ), tmp_path, logs).fit()
    got = [m["train/lr"] for _, _, m in logs]
    want = [lr_at(i * TPS, cfg.schedule, cfg.optimizer, cfg.tokens) for i in range(6)]
    assert got == pytest.approx(want) and got[0] == 0.0 and got[2] == 3e-3


def _reference_step_stats(model, batch):
    """grad_norm / num_zeros / params_norm / lm_loss by hand on a copy, one micro-batch."""
    model = copy.deepcopy(model)
    loss, metrics = LMObjective(0.0).loss(model, batch, float(batch.shape[0] * (batch.shape[1] - 1)), LossContext())
    loss.backward()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return {
        "lm_loss": metrics["lm_loss"].item(),
        "grad_norm": torch.cat([g.flatten() for g in grads]).norm().item(),
        "num_zeros": sum(int((g == 0).sum()) for g in grads),
        "params_norm": torch.cat([p.detach().flatten() for p in model.parameters()]).norm().item(),
    }


def test_step_stats_match_a_hand_computation_and_grad_norm_is_pre_clip(tmp_path, tiny_model, batches_factory):
    batches = batches_factory(GLOBAL, SEQ)
    want = _reference_step_stats(tiny_model, batches_factory(GLOBAL, SEQ).next_batch())
    logs = []
    cfg = train_cfg(steps=1, micro_batch=GLOBAL, lb_loss_coeff=0.0, optimizer={"grad_clip": 1e-3})
    make_trainer(tiny_model, cfg, batches, tmp_path, logs).fit()
    got = logs[0][2]
    assert got["train/lm_loss"] == pytest.approx(want["lm_loss"], rel=1e-5)
    assert got["train/grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4) and got["train/grad_norm"] > 1e-2
    assert got["train/num_zeros"] == want["num_zeros"] > 0  # embedding rows of unseen tokens
    assert got["train/params_norm"] == pytest.approx(want["params_norm"], rel=1e-5)


def test_gradient_accumulation_equals_one_big_batch(tmp_path, model_factory, batches_factory):
    results = {}
    for micro in (GLOBAL, 2):
        model, logs = model_factory(), []
        cfg = train_cfg(steps=2, micro_batch=micro, lb_loss_coeff=0.0)
        make_trainer(model, cfg, batches_factory(GLOBAL, SEQ), tmp_path / str(micro), logs).fit()
        results[micro] = ([m["train/lm_loss"] for _, _, m in logs], model.state_dict())
    assert results[2][0] == pytest.approx(results[GLOBAL][0], rel=1e-5)
    for name, value in results[GLOBAL][1].items():
        # float rounding of the summation order, through two Adam steps: ~1e-5 (a wrong split moves
        # weights by ~lr = 3e-3)
        torch.testing.assert_close(results[2][1][name], value, rtol=1e-4, atol=3e-5, msg=name)


def test_checkpoints_at_each_multiple_and_pruning(tmp_path, tiny_model, batches_factory):
    cfg = train_cfg(steps=10, checkpoint_every_tokens=600, keep_checkpoints=2)  # TPS=256
    make_trainer(tiny_model, cfg, batches_factory(GLOBAL, SEQ), tmp_path).fit()
    # multiples 600, 1200, 1800, 2400 are first reached at steps 3, 5, 8, 10; step 10 is the final one
    steps = [ck.read_meta(p).step for p in ck.list_checkpoints(tmp_path)]
    assert steps == [5, 8, 10]
    meta = ck.read_meta(tmp_path / "step-00000010")
    assert meta.parent == str(tmp_path / "step-00000008") and meta.tokens_seen == 10 * TPS


def test_fit_in_chunks_and_data_exhaustion(tmp_path, tiny_model, batches_factory):
    trainer = make_trainer(tiny_model, train_cfg(steps=6), batches_factory(GLOBAL, SEQ, limit=5), tmp_path)
    first = trainer.fit(until_tokens=int(2.5 * TPS))  # rounds up to whole steps
    assert (first.step, first.stop_reason, first.checkpoint.name) == (3, "until_tokens", "step-00000003")
    second = trainer.fit()
    assert (second.step, second.stop_reason, second.checkpoint.name) == (5, "data_exhausted", "step-00000005")


def _losses(logs):
    return [m["train/lm_loss"] for _, _, m in logs]


def test_resume_reproduces_an_uninterrupted_run(tmp_path, model_factory, batches_factory):
    cfg = train_cfg(steps=8)
    straight = []
    a = make_trainer(model_factory(seed=0), cfg, batches_factory(GLOBAL, SEQ), tmp_path / "a", straight)
    a.fit()

    first = []
    b1 = make_trainer(model_factory(seed=0), cfg, batches_factory(GLOBAL, SEQ), tmp_path / "b", first)
    ckpt = b1.fit(until_tokens=4 * TPS).checkpoint
    del b1
    torch.manual_seed(123)  # a different process state; resume must restore it
    second = []
    b2 = make_trainer(model_factory(seed=7), cfg, batches_factory(GLOBAL, SEQ), tmp_path / "b", second)
    b2.resume(ckpt)
    assert (b2.step, b2.tokens_seen, b2.batches.i) == (4, 4 * TPS, 4)
    result = b2.fit()
    assert result.step == 8
    assert [s for s, _, _ in first + second] == list(range(1, 9))
    assert _losses(first + second) == _losses(straight)  # bit for bit (tests/model/test_exact_resume.py)
    moe = [m["moe/layer2/max_vio"] for _, _, m in second]
    assert moe == [m["moe/layer2/max_vio"] for _, _, m in straight[4:]]
    for (name, x), y in zip(a.model.state_dict().items(), b2.model.state_dict().values()):
        assert torch.equal(x, y), name


def test_resume_refuses_a_checkpoint_without_trainer_state(tmp_path, tiny_model, batches_factory):
    path = ck.save_checkpoint(tmp_path / "plain", tiny_model, None, ck.CheckpointMeta("pretrain", 1, 1, "h"))
    with pytest.raises(ValueError, match="not a resumable"):
        make_trainer(tiny_model, train_cfg(), batches_factory(GLOBAL, SEQ), tmp_path).resume(path)


class PoisonAt:
    """Wraps a batch source; at batch `at` (1-based) runs `poison()` first."""

    def __init__(self, inner, at, poison):
        self.inner, self.at, self.poison, self.n = inner, at, poison, 0

    def next_batch(self):
        self.n += 1
        if self.n == self.at:
            self.poison()
        return self.inner.next_batch()

    def state_dict(self):
        return self.inner.state_dict()


@pytest.mark.parametrize("where", ["loss", "grad_norm"])
def test_nan_raises_diverged_without_touching_the_last_checkpoint(tmp_path, tiny_model, batches_factory, where):
    def poison():
        if where == "loss":
            with torch.no_grad():
                tiny_model.lm_head.weight[0, 0] = float("nan")
        else:
            tiny_model.model.layers[3].mixer.up_proj.weight.register_hook(lambda g: g * float("nan"))

    logs = []
    cfg = train_cfg(steps=10, checkpoint_every_tokens=2 * TPS)
    trainer = make_trainer(tiny_model, cfg, PoisonAt(batches_factory(GLOBAL, SEQ), 5, poison), tmp_path, logs)
    with pytest.raises(TrainingDiverged, match="step 5") as info:
        trainer.fit()
    assert (info.value.step, info.value.quantity) == (5, where)
    assert info.value.last_checkpoint == tmp_path / "step-00000004"
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000004"]
    good = tmp_path / "step-00000004"
    assert ck.read_meta(good).weight_sha256 == ck.weights_sha256(good)
    assert [s for s, _, _ in logs] == [1, 2, 3, 4]  # the good steps were flushed before raising
    if where == "grad_norm":  # refused before the update: the weights are still finite
        assert all(torch.isfinite(p).all() for p in tiny_model.parameters())


def test_progress_bar_without_a_tty(tmp_path, tiny_model, batches_factory, capsys):
    result = make_trainer(tiny_model, train_cfg(steps=2), batches_factory(GLOBAL, SEQ), tmp_path, progress=True).fit()
    assert result.step == 2
    assert "\x1b[?25l" not in capsys.readouterr().out  # no cursor control codes on stdout


def test_mtp_heads_are_trained_and_recorded(tmp_path, tiny_model, batches_factory):
    from stagewise.model.mtp import attach_mtp

    attach_mtp(tiny_model, 2, loss_weight=0.5)
    logs = []
    result = make_trainer(tiny_model, train_cfg(steps=2), batches_factory(GLOBAL, SEQ), tmp_path, logs).fit()
    last = logs[-1][2]
    assert last["train/mtp1_loss"] > 0 and last["train/mtp2_loss"] > 0
    lb = 1e-3 * last["train/lb_loss"]
    mtp = 0.5 * (last["train/mtp1_loss"] + last["train/mtp2_loss"]) / 2
    assert last["train/loss"] == pytest.approx(last["train/lm_loss"] + lb + mtp, rel=1e-5)
    assert ck.read_meta(result.checkpoint).extra["mtp"] == {"num_heads": 2, "loss_weight": 0.5}


def test_mfu_counts_active_parameters(tiny_model):
    total = sum(p.numel() for p in tiny_model.parameters())
    emb = tiny_model.model.embeddings.weight.numel()
    experts = sum(p.numel() for p in tiny_model.model.layers[2].mixer.experts.parameters())
    assert active_params(tiny_model) == total - emb - experts // 2  # top-2 of 4 experts
    # one attention layer, 4 heads x 16: 12 * 1 * 64 * T on top of 6N
    assert flops_per_token(tiny_model, 100) == 6 * active_params(tiny_model) + 12 * 64 * 100
    peak = peak_flops("cpu", torch.float32)
    assert peak > 1e8 and peak_flops("cpu", torch.float32) == peak  # measured once, cached


def test_monitor_hooks_leave_with_the_trainer(tmp_path, tiny_model, batches_factory):
    import gc

    gate = tiny_model.model.layers[2].mixer.gate
    with make_trainer(tiny_model, train_cfg(steps=1), batches_factory(GLOBAL, SEQ), tmp_path) as trainer:
        assert trainer.routing is not None and gate._forward_hooks
    assert not gate._forward_hooks and not tiny_model.model.layers[0]._forward_hooks
    make_trainer(tiny_model, train_cfg(steps=1), batches_factory(GLOBAL, SEQ), tmp_path)
    gc.collect()  # a dropped Trainer takes its hooks along
    assert not gate._forward_hooks


@pytest.fixture
def pretrain_batches(tmp_path):
    """Real data.loader.PretrainBatches over a small shard of learnable documents."""
    from types import SimpleNamespace

    import numpy as np

    from stagewise.data.config import PhaseConfig
    from stagewise.data.loader import PretrainBatches
    from stagewise.data.shards import SourceShards, write_shard

    rng = np.random.default_rng(0)
    docs = [np.append((rng.integers(3, 256) + np.arange(rng.integers(20, 80)) * 2) % 253 + 3, 2) for _ in range(60)]
    shard = write_shard(tmp_path / "shard", docs, vocab_size=256, eos_id=2)
    prepared = SimpleNamespace(digest="toy", sources={"toy": SourceShards(shard.path, shard.path, shard.n_tokens, 0, 60)})

    def make(total_tokens, max_epochs=100.0):
        phases = [PhaseConfig(name="all", blend={"toy": 1.0})]
        return PretrainBatches(prepared, phases, {"toy": max_epochs}, SEQ, GLOBAL, total_tokens, seed=3)

    return make


def test_resume_with_the_real_loader(tmp_path, model_factory, pretrain_batches):
    cfg = train_cfg(steps=6)
    straight = []
    make_trainer(model_factory(), cfg, pretrain_batches(cfg.tokens), tmp_path / "a", straight).fit()
    first, second = [], []
    ckpt = make_trainer(model_factory(), cfg, pretrain_batches(cfg.tokens), tmp_path / "b", first).fit(3 * TPS).checkpoint
    resumed = make_trainer(model_factory(seed=5), cfg, pretrain_batches(cfg.tokens), tmp_path / "b", second)
    resumed.resume(ckpt)
    resumed.fit()
    assert _losses(first + second) == _losses(straight)
    assert resumed.batches.realized() == {"all": {"toy": 6 * TPS}}


def test_data_exhausted_from_the_real_loader_ends_the_fit(tmp_path, tiny_model, pretrain_batches):
    batches = pretrain_batches(100 * TPS, max_epochs=1.0)  # ~3k tokens: about 11 steps' worth
    result = make_trainer(tiny_model, train_cfg(steps=100), batches, tmp_path).fit()
    assert result.stop_reason == "data_exhausted" and 0 < result.step < 100
    assert ck.read_meta(result.checkpoint).step == result.step


def test_past_budget_trains_beyond_it_at_the_schedules_end_value(tmp_path, tiny_model, batches_factory):
    """A person extending a gate's budget: fit goes past `tokens` only when asked, the LR as the schedule
    has it after its end (a cosine schedule stays at min_lr), and a resume carries on from there."""
    cfg = train_cfg(steps=4, schedule={"kind": "cosine"})
    capped = make_trainer(copy.deepcopy(tiny_model), cfg, batches_factory(GLOBAL, SEQ), tmp_path / "capped").fit(7 * TPS)
    assert (capped.step, capped.stop_reason) == (4, "budget")
    logs = []
    trainer = make_trainer(tiny_model, cfg, batches_factory(GLOBAL, SEQ), tmp_path / "past", logs)
    first = trainer.fit()
    extended = trainer.fit(7 * TPS, past_budget=True)
    assert (first.step, extended.step, extended.tokens_seen) == (4, 7, 7 * TPS)
    lrs = [m["train/lr"] for _, _, m in logs]
    assert len(lrs) == 7 and lrs[4:] == [cfg.optimizer.min_lr] * 3 and lrs[0] == cfg.optimizer.lr
    assert ck.latest_checkpoint(tmp_path / "past") == tmp_path / "past" / "step-00000007"
