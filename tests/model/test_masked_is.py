"""Masked importance sampling with a split rollout batch (model/rl_batches.py, model/objectives/grpo.py):
synchronous rollouts take π_old from the trainer at the sampling weights (none on the first part, a
no-grad forward on the later ones, computed before any update), a bf16 sampler's numerics are what
the masked IS weight then masks, and one-step off-policy rollouts in minibatches without
recompute_old_logprobs still train with an inert (w = 1) weight."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from stagewise.model.config import OptimizerConfig, ScheduleConfig, TrainConfig
from stagewise.model.objectives.grpo import GRPOConfig, GRPOObjective, token_logprobs
from stagewise.model.rl_batches import Prompt, RolloutBatches, RolloutSettings
from stagewise.model.rollout import make_generator
from stagewise.model.rollout.hf import HFGenerator
from stagewise.model.trainer import Trainer

END = 3
PROMPTS = {f"p{i}": Prompt(f"p{i}", "d", tuple(random.Random(i).randrange(4, 200) for _ in range(3 + i % 4)))
           for i in range(8)}
TIGHT = GRPOConfig(is_low=0.99, is_high=1.01)  # a 1% band: any real sampler/trainer disagreement is masked


class FixedSampler:
    """The same eight prompts every step."""

    def sample(self, step: int, attempt: int) -> list[str]:
        return sorted(PROMPTS)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def parity_score(prompt, group):
    acc = [float(bool(r.response_ids) and r.response_ids[0] % 2 == 0) for r in group]
    return {"accuracy": acc, "total": acc}


def sharp(model: torch.nn.Module) -> torch.nn.Module:
    """Logits of a trained model's size (a random tiny model's are near 0, where bf16 rounds little)."""
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    return model


def make(model, precision: str = "trainer", **kw) -> RolloutBatches:
    settings = RolloutSettings(group_size=4, max_new_tokens=6, temperature=1.0, max_refills=0,
                               sampler_precision=precision, **kw)
    generator = HFGenerator(model, [END], 0, precision=precision)
    return RolloutBatches(model, generator, PROMPTS, FixedSampler(), parity_score, settings, seed=3, pad_id=0)


def cfg(steps: int) -> TrainConfig:
    seq, rows = 16, 16
    return TrainConfig(tokens=steps * seq * rows, seq_length=seq, global_batch=rows, micro_batch=8,
                       optimizer=OptimizerConfig(lr=1e-2, min_lr=1e-2, weight_decay=0.0),
                       schedule=ScheduleConfig(kind="constant"), lb_loss_coeff=0.0)


def masked_fraction(objective: GRPOObjective, model, part) -> float:
    with torch.no_grad():
        _, metrics = objective.loss(model, part, part["response_mask"].sum().clamp(min=1), None)
    return float(metrics["is_masked_fraction"])


def test_synchronous_parts_take_pi_old_from_the_trainer_before_any_update(model_factory, tmp_path):
    model = model_factory(pattern="M*-")
    before = copy.deepcopy(model)
    batches = make(model, off_policy=False, minibatches=2)
    trainer = Trainer(model, cfg(2), batches, GRPOObjective(GRPOConfig()), tmp_path, "rl", None, "h", progress=False)
    first = batches.next_batch()
    assert "old_logprobs" not in first  # its own forward, before its update, is π_old (ρ = 1)
    second = batches._queue[0]  # split (and scored) with the first: before the first part trains
    trainer.train_step(first)
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), model.state_dict().values()))
    assert batches.next_batch() is second
    mask = second["response_mask"]
    with torch.no_grad():
        at_sampling, _ = token_logprobs(before, second["input_ids"], 1.0)
        now, _ = token_logprobs(model, second["input_ids"], 1.0)
    assert torch.allclose(second["old_logprobs"], at_sampling * mask, atol=1e-6)
    on = mask.bool()
    assert not torch.allclose(second["old_logprobs"][on], now[on], atol=1e-3)  # the update moved π_θ, not π_old
    # so ρ carries the first update (clipped), while w compares the sampler with the trainer at the same weights
    assert torch.allclose(second["old_logprobs"][on], second["rollout_logprobs"][on], atol=1e-4)
    batches.close()


def test_a_bf16_sampler_is_what_the_masked_is_weight_masks(model_factory):
    objective = GRPOObjective(TIGHT)
    fractions = {}
    for precision in ("trainer", "bf16"):
        model = sharp(model_factory(pattern="M*-"))
        batches = make(model, precision, off_policy=False, minibatches=2)
        parts = [batches.next_batch(), batches.next_batch()]  # no update between: both at the sampling weights
        assert all(part["rollout_logprobs"].dtype == torch.float32 for part in parts)
        fractions[precision] = [masked_fraction(objective, model, part) for part in parts]
        batches.close()
    assert max(fractions["trainer"]) <= 0.01  # the fp32 sampler agrees with the trainer to ~1e-4
    assert all(b > 0 for b in fractions["bf16"])  # the first part (π_old = its own forward) and the second
    assert sum(fractions["bf16"]) > sum(fractions["trainer"])


def test_the_bf16_sampler_scores_trainer_style_and_syncs_cast_copies(model_factory):
    model = sharp(model_factory(pattern="M*-"))
    gen = HFGenerator(model, [END], 0, precision="bf16")
    assert next(gen.model.parameters()).dtype == torch.bfloat16
    changed = sharp(model_factory(pattern="M*-", seed=1))
    gen.sync_weights(changed.state_dict())
    assert all(torch.equal(p, q.to(torch.bfloat16)) for p, q in zip(gen.model.parameters(), changed.parameters()))
    [[rollout]] = gen.generate([[5, 6, 7]], 1, 6, 1.0, seed=1)
    assert all(isinstance(x, float) for x in rollout.logprobs)
    ids = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    with torch.no_grad():
        trainer, _ = token_logprobs(changed, ids, 1.0)
    assert torch.equal(gen.token_logprobs(ids, 1.0), trainer)  # recompute_old_logprobs: the trainer's precision
    with pytest.raises(ValueError, match="precision"):
        HFGenerator(model, [END], 0, precision="fp16")


def test_a_bf16_worker_samples_as_an_in_process_bf16_generator(model_factory):
    model = sharp(model_factory(pattern="M*-"))
    local = HFGenerator(model, [END], 0, precision="bf16")
    with make_generator("hf-process", model, [END], 0, threads=1, precision="bf16") as remote:
        assert remote.precision == "bf16"
        got = remote.generate([[5, 6, 7], [8, 9]], 2, 6, 1.0, 11)
    want = local.generate([[5, 6, 7], [8, 9]], 2, 6, 1.0, 11)
    assert [[(r.response_ids, r.logprobs) for r in g] for g in got] == \
        [[(r.response_ids, r.logprobs) for r in g] for g in want]


def test_off_policy_minibatches_without_recompute_still_train_with_an_inert_weight(model_factory, tmp_path):
    model = sharp(model_factory(pattern="M*-"))
    start = copy.deepcopy(model.state_dict())
    batches = make(model, "bf16", off_policy=True, minibatches=2)
    objective = GRPOObjective(TIGHT)
    trainer = Trainer(model, cfg(2), batches, objective, tmp_path, "rl", None, "h", progress=False)
    for _ in range(2):
        part = batches.next_batch()
        assert torch.equal(part["old_logprobs"], part["rollout_logprobs"])  # π_old = the sampler's: w = 1
        assert masked_fraction(objective, model, part) == 0.0  # even a bf16 sampler in a 1% band masks nothing
        metrics = trainer.train_step(part)
        assert all(v == v for v in metrics.values())  # finite (no NaN)
    batches.close()
    assert any(not torch.equal(a, b) for a, b in zip(start.values(), model.state_dict().values()))
