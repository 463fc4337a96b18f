"""RolloutBatches: alignment of rollouts into a GRPO batch, dynamic sampling, one-step
off-policy, and exact resume through the engine (model/rl_batches.py)."""

from __future__ import annotations

import random

import pytest
import torch

from stagewise.model.config import OptimizerConfig, ScheduleConfig, TrainConfig
from stagewise.model.objectives.grpo import GRPOConfig, GRPOObjective, token_logprobs
from stagewise.model.rl_batches import Prompt, RolloutBatches, RolloutSettings, decode_batch, encode_batch, pass_rates
from stagewise.model.rollout.hf import HFGenerator
from stagewise.model.trainer import Trainer

END = 3
PROMPTS = {f"p{i}": Prompt(f"p{i}", "even" if i % 2 else "odd", tuple(random.Random(i).randrange(4, 200)
                                                                     for _ in range(3 + i % 4))) for i in range(12)}


class CycleSampler:
    """Four prompts per step, in order (deterministic in step and attempt)."""

    def __init__(self):
        self.calls = 0

    def sample(self, step: int, attempt: int) -> list[str]:
        ids = sorted(PROMPTS)
        start = (4 * (step - 1) + 5 * attempt) % len(ids)
        return [ids[(start + k) % len(ids)] for k in range(4)]

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


def parity_score(prompt, group):
    """1 when the first sampled token is even: rewards that vary inside most groups."""
    acc = [float(bool(r.response_ids) and r.response_ids[0] % 2 == 0) for r in group]
    return {"accuracy": acc, "total": acc}


def constant_score(prompt, group):
    return {"accuracy": [1.0] * len(group), "total": [1.0] * len(group)}


def make_batches(model, off_policy: bool, score=parity_score, **kw) -> RolloutBatches:
    settings = RolloutSettings(group_size=4, max_new_tokens=5, temperature=1.0, off_policy=off_policy, **kw)
    return RolloutBatches(model, HFGenerator(model, [END], 0), PROMPTS, CycleSampler(), score, settings, seed=7,
                          pad_id=0)


def test_rollouts_line_up_with_the_trainer_view(model_factory):
    model = model_factory(pattern="M*-")
    batches = make_batches(model, off_policy=False)
    batch = batches.next_batch().validate()
    assert batch.metrics["rl/groups"] == 4 and batch.metrics["rl/kept_groups"] >= 1
    n = int(batch.metrics["rl/kept_groups"]) * 4
    assert batch["input_ids"].shape[0] == n and batch["advantages"].shape == (n,)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch["input_ids"], 1.0)
    mask = batch["response_mask"].bool()
    # the sampler's log-probs (cached, left-padded decoding) are the trainer's up to numerics
    assert torch.allclose(logp[mask], batch["rollout_logprobs"][mask], atol=1e-4)
    # every group's advantages sum to zero (leave-one-out) and the mask covers the response exactly
    assert torch.allclose(batch["advantages"].view(-1, 4).sum(1), torch.zeros(n // 4), atol=1e-6)
    for row, m in zip(batch["input_ids"], batch["response_mask"]):
        first = int(m.argmax()) + 1  # the first response token's index in input_ids
        assert tuple(row[:first].tolist()) in {p.ids for p in PROMPTS.values()}


def test_groups_without_reward_variance_are_dropped_and_counted(model_factory):
    model = model_factory(pattern="M*-")
    batch = make_batches(model, off_policy=False, score=constant_score, max_refills=1).next_batch()
    assert batch.metrics["rl/kept_groups"] == 0
    assert batch.metrics["rl/dropped_groups"] == batch.metrics["rl/groups"] == 8  # two draws of four
    # nothing to learn from: the step still runs, with zero advantages
    assert batch["advantages"].abs().sum() == 0 and batch.metrics["rl/empty_step"] == 1.0


def test_off_policy_batches_are_sampled_one_step_behind(model_factory, tmp_path):
    model = model_factory(pattern="M*-")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    batches = make_batches(model, off_policy=True, recompute_old_logprobs=True)
    trainer = Trainer(model, _cfg(2), batches, GRPOObjective(GRPOConfig()), tmp_path, "rl", None, "h", progress=False)
    trainer.fit(until_tokens=_cfg(2).tokens_per_step)  # step 1 trains; step 2's rollouts were sampled before it
    batches.close()
    pending = batches._pending.result()
    before = model_factory(pattern="M*-")
    before.load_state_dict(start)
    with torch.no_grad():
        at_start, _ = token_logprobs(before, pending["input_ids"], 1.0)
        now, _ = token_logprobs(model, pending["input_ids"], 1.0)
    mask = pending["response_mask"].bool()
    assert torch.allclose(pending["old_logprobs"][mask], at_start[mask], atol=1e-6)
    assert not torch.allclose(pending["old_logprobs"][mask], now[mask], atol=1e-6)


def test_without_recompute_the_batch_leaves_the_staleness_to_the_is_weight(model_factory):
    batch = make_batches(model_factory(pattern="M*-"), off_policy=True).next_batch()
    assert "old_logprobs" not in batch  # the objective's IS weight is then pi_theta / pi_rollout


class CountingGenerator(HFGenerator):
    """HFGenerator that counts its generate calls."""

    calls = 0

    def generate(self, *args, **kw):
        self.calls += 1
        return super().generate(*args, **kw)


@pytest.mark.parametrize("off_policy", [False, True])
def test_a_rollout_batch_is_split_into_minibatch_steps(model_factory, off_policy):
    model = model_factory(pattern="M*-")
    settings = RolloutSettings(group_size=4, max_new_tokens=5, off_policy=off_policy, minibatches=2, max_refills=0)
    generator = CountingGenerator(model, [END], 0)
    batches = RolloutBatches(model, generator, PROMPTS, CycleSampler(), parity_score, settings, seed=7, pad_id=0)
    whole = make_batches(model_factory(pattern="M*-"), off_policy=off_policy, max_refills=0).next_batch()
    first = batches.next_batch()
    assert generator.calls == 1  # part one of the rollout; off-policy prefetches only after the last part
    second = batches.next_batch()
    batches.close()  # an off-policy prefetch runs in the background: wait for it before counting
    assert (batches.step, batches.rollout) == (2, 1)  # one rollout, two steps
    assert generator.calls == 1 + off_policy  # ... and, off-policy, the next rollout sampled after the last part
    # every row once, shortest first, each part cut to its longest row (only padding is cut)
    assert abs(len(first["input_ids"]) - len(second["input_ids"])) <= 1
    assert first["input_ids"].shape[1] <= second["input_ids"].shape[1] <= whole["input_ids"].shape[1]
    seen = []
    for part in (first, second):
        w = part["input_ids"].shape[1]
        assert part["response_mask"][:, -1].sum() > 0  # the longest row's last target is a response token
        for ids, mask, adv in zip(part["input_ids"], part["response_mask"], part["advantages"]):
            row = next(i for i in range(len(whole["input_ids"])) if i not in seen
                       and torch.equal(whole["input_ids"][i, :w], ids) and whole["advantages"][i] == adv
                       and torch.equal(whole["response_mask"][i, :w - 1], mask)
                       and whole["response_mask"][i, w - 1:].sum() == 0)
            seen.append(row)
    assert sorted(seen) == list(range(len(whole["input_ids"])))
    with torch.no_grad():  # the cut columns change nothing the loss reads
        cut, _ = token_logprobs(model, first["input_ids"], 1.0)
        full, _ = token_logprobs(model, whole["input_ids"][seen[:len(first["input_ids"])]], 1.0)
    mask = first["response_mask"].bool()
    assert torch.allclose(cut[mask], full[:, :cut.shape[1]][mask], atol=1e-5)
    if off_policy:  # ratio against the sampler's log-probs, so the second step's is clipped (and w = 1)
        for part in (first, second):
            assert torch.equal(part["old_logprobs"], part["rollout_logprobs"])
    else:  # the trainer's at the sampling weights: the first part's own forward, the second's computed
        assert "old_logprobs" not in first
        with torch.no_grad():
            trainer, _ = token_logprobs(model, second["input_ids"], 1.0)
        assert torch.allclose(second["old_logprobs"], trainer * second["response_mask"], atol=1e-6)
    for part in (first, second):
        assert part.metrics["rl/reward/accuracy"] == whole.metrics["rl/reward/accuracy"]
    assert first.metrics == second.metrics  # the rollout's figures, on each of its steps
    batches.next_batch()
    assert (batches.step, batches.rollout) == (3, 2)
    batches.close()


def test_minibatches_must_leave_every_part_a_row():
    with pytest.raises(ValueError, match="minibatches"):
        RolloutSettings(group_size=4, minibatches=5)


def test_batch_encoding_is_exact(model_factory):
    batch = make_batches(model_factory(pattern="M*-"), off_policy=True).next_batch()
    again = decode_batch(encode_batch(batch))
    assert set(again) == set(batch) and all(torch.equal(again[k], batch[k]) for k in batch)
    assert again.metrics == batch.metrics


@pytest.mark.parametrize("off_policy,recompute,minibatches",
                         [(True, False, 1), (True, True, 1), (False, False, 1), (True, False, 4), (False, False, 4)])
def test_resume_gives_the_same_weights(model_factory, tmp_path, off_policy, recompute, minibatches):
    cfg = _cfg(4, every=2)  # with 4 minibatches the checkpoint at step 2 is in the middle of a rollout batch

    def run(out, stop_after: int | None):
        model = model_factory(pattern="M*-")
        batches = make_batches(model, off_policy=off_policy, recompute_old_logprobs=recompute,
                               minibatches=minibatches)
        trainer = Trainer(model, cfg, batches, GRPOObjective(GRPOConfig()), out, "rl", None, "h", progress=False)
        trainer.fit(until_tokens=None if stop_after is None else stop_after * cfg.tokens_per_step)
        batches.close()
        return model, trainer

    whole, _ = run(tmp_path / "a", None)
    _, first = run(tmp_path / "b", 2)
    model = model_factory(pattern="M*-")
    batches = make_batches(model, off_policy=off_policy, recompute_old_logprobs=recompute, minibatches=minibatches)
    resumed = Trainer(model, cfg, batches, GRPOObjective(GRPOConfig()), tmp_path / "b", "rl", None, "h", progress=False)
    resumed.resume(first.last_checkpoint)
    resumed.fit()
    batches.close()
    for (name, a), b in zip(whole.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_pass_rates_are_per_prompt_and_deterministic(model_factory):
    model = model_factory(pattern="M*-")
    gen = HFGenerator(model, [END], 0)
    prompts = list(PROMPTS.values())[:5]
    a = pass_rates(gen, prompts, parity_score, samples=6, max_new_tokens=3, temperature=1.0, seed=1, chunk=2)
    assert list(a) == [p.id for p in prompts] and all(len(v) == 6 for v in a.values())
    assert a == pass_rates(gen, prompts, parity_score, samples=6, max_new_tokens=3, temperature=1.0, seed=1, chunk=2)
    greedy = pass_rates(gen, prompts, parity_score, samples=6, max_new_tokens=3, temperature=0.0, seed=1)
    assert all(len(v) == 1 for v in greedy.values())


def _cfg(steps: int, every: int | None = None) -> TrainConfig:
    seq, rows = 16, 16
    return TrainConfig(tokens=steps * seq * rows, seq_length=seq, global_batch=rows, micro_batch=8,
                       optimizer=OptimizerConfig(lr=1e-2, min_lr=1e-2, weight_decay=0.0),
                       schedule=ScheduleConfig(kind="constant"), lb_loss_coeff=0.0,
                       checkpoint_every_tokens=every * seq * rows if every else None)


def test_the_plateau_rule_compares_two_windows():
    from stagewise.model.rl_batches import PlateauRule

    rule = PlateauRule(window=3, min_gain=0.05)
    assert not rule.stalled([0.1] * 5, since=0)  # fewer than two windows
    assert rule.stalled([0.1, 0.1, 0.1, 0.12, 0.13, 0.11], since=0)  # +0.017 <= 0.05
    assert not rule.stalled([0.1, 0.1, 0.1, 0.2, 0.2, 0.2], since=0)
    assert not rule.stalled([0.1] * 8, since=3)  # only 5 steps since the last re-profile


def test_a_stalled_reward_reprofiles_between_rollouts_and_resumes_the_same(model_factory, tmp_path):
    from stagewise.model.rl_batches import PlateauRule

    cfg = _cfg(6, every=3)

    def run(out, until=None, resume_from=None):
        model = model_factory(pattern="M*-")
        calls: list[int] = []
        batches = make_batches(model, off_policy=True)
        batches.reprofile, batches.plateau = calls.append, PlateauRule(window=2, min_gain=1.0)  # always stalled
        trainer = Trainer(model, cfg, batches, GRPOObjective(GRPOConfig()), out, "rl", None, "h", progress=False)
        if resume_from:
            trainer.resume(resume_from)
        trainer.fit(until_tokens=until)
        batches.close()
        return model, trainer, calls

    whole, _, calls = run(tmp_path / "a")
    assert calls == [5]  # after two windows of 2 steps, at step 5's draw; then not again within 4 steps
    _, first, _ = run(tmp_path / "b", until=3 * cfg.tokens_per_step)
    resumed, _, calls = run(tmp_path / "b", resume_from=first.last_checkpoint)
    assert calls == [5]  # the history came back with the checkpoint
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), resumed.state_dict().values()))


def test_a_reference_gives_every_batch_its_log_probs_for_the_kl_term(model_factory):
    model = model_factory(pattern="M*-")
    anchor = model_factory(pattern="M*-", seed=1)
    batches = make_batches(model, off_policy=False)
    batches.reference = lambda ids: token_logprobs(anchor, ids, 1.0)[0]
    batch = batches.next_batch().validate()
    with torch.no_grad():
        expected = token_logprobs(anchor, batch["input_ids"], 1.0)[0] * batch["response_mask"]
    assert torch.equal(batch["ref_logprobs"], expected)
    loss, metrics = GRPOObjective(GRPOConfig(kl_coeff=0.1)).loss(model, batch, batch["response_mask"].sum(), None)
    assert metrics["kl"] > 0  # the policy is not the anchor
