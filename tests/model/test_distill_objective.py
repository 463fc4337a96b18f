"""On-policy distillation (ALGORITHMS.md section 7): the per-token advantage on the sampled
token against hand-computed values, the discount, the reverse-KL estimate, and GRPO's loss
taking per-token advantages (its gradient is -sum_t A_t grad log pi(y_t) / N on policy)."""

from __future__ import annotations

import pytest
import torch

from stagewise.model.objectives import LossContext
from stagewise.model.objectives.distill import distill_advantages, reverse_kl
from stagewise.model.objectives.grpo import GRPOConfig, GRPOObjective, RolloutBatch, token_logprobs

MASK = torch.tensor([[0.0, 1, 1, 1], [0.0, 0, 1, 0]])
TEACHER = torch.tensor([[9.0, -0.5, -1.0, -0.2], [9.0, 9.0, -3.0, 9.0]])
STUDENT = torch.tensor([[-7.0, -2.0, -1.0, -0.7], [-7.0, -7.0, -1.0, -7.0]])


def test_the_advantage_is_teacher_minus_student_on_response_tokens_only():
    adv = distill_advantages(TEACHER, STUDENT, MASK)
    # the section's example: student -2.0, teacher -0.5 -> +1.5 (push the token up)
    assert adv.tolist() == [[0.0, 1.5, 0.0, 0.5], [0.0, 0.0, -2.0, 0.0]]


def test_a_discount_adds_the_later_tokens_of_the_same_response():
    adv = distill_advantages(TEACHER, STUDENT, MASK, discount=0.5)
    # row 0: d = [1.5, 0, 0.5] -> [1.5 + 0.5 * 0 + 0.25 * 0.5, 0 + 0.5 * 0.5, 0.5]
    assert adv[0].tolist() == pytest.approx([0.0, 1.625, 0.25, 0.5])
    assert adv[1].tolist() == pytest.approx([0.0, 0.0, -2.0, 0.0])
    plain = distill_advantages(TEACHER, STUDENT, MASK)
    assert torch.equal(distill_advantages(TEACHER, STUDENT, MASK, discount=0.0), plain)
    with pytest.raises(ValueError, match="discount"):
        distill_advantages(TEACHER, STUDENT, MASK, discount=1.5)


def test_reverse_kl_is_the_mean_student_minus_teacher_over_response_tokens():
    # tokens: -2 - -0.5 = -1.5, 0, -0.7 - -0.2 = -0.5, -1 - -3 = 2
    assert reverse_kl(TEACHER, STUDENT, MASK) == pytest.approx((-1.5 + 0 - 0.5 + 2) / 4)
    assert reverse_kl(TEACHER, STUDENT, torch.zeros_like(MASK)) == 0.0


def _batch(model, per_token: bool) -> RolloutBatch:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 256, (3, 9), generator=g)
    mask = torch.zeros(3, 8)
    mask[:, 3:] = 1
    mask[2, 6:] = 0
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids)
    adv = torch.randn(3, 8, generator=g) * mask if per_token else torch.randn(3, generator=g)
    return RolloutBatch(input_ids=ids, response_mask=mask, advantages=adv, rollout_logprobs=logp * mask).validate()


def test_grpo_takes_per_token_advantages_and_their_gradient_is_the_distillation_one(tiny_model):
    batch = _batch(tiny_model, per_token=True)
    objective = GRPOObjective(GRPOConfig())
    denom = objective.denominator([batch])
    loss, metrics = objective.loss(tiny_model, batch, denom, LossContext())
    mask = batch["response_mask"]
    # on policy rho = 1 and w = 1: the loss is -sum_t A_t / N over response tokens
    assert loss.item() == pytest.approx(-(batch["advantages"] * mask).sum().item() / mask.sum().item(), abs=1e-6)
    loss.backward()
    got = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in tiny_model.parameters()]
    tiny_model.zero_grad(set_to_none=True)
    logp, _ = token_logprobs(tiny_model, batch["input_ids"])
    (-(batch["advantages"] * logp * mask).sum() / mask.sum()).backward()
    want = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in tiny_model.parameters()]
    assert any(w.abs().sum() > 0 for w in want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert float(metrics["is_masked_fraction"]) == 0.0  # the student's own log-probs: w = 1


def test_a_per_token_advantage_of_the_wrong_shape_is_refused(tiny_model):
    batch = _batch(tiny_model, per_token=True)
    batch["advantages"] = batch["advantages"][:, :-1]
    with pytest.raises(ValueError, match="advantages must be"):
        batch.validate()


def test_a_token_the_teacher_could_not_score_carries_no_signal():
    teacher = TEACHER.clone()
    teacher[0, 1], teacher[0, 3] = -9999.0, float("nan")  # vLLM's answer for probability 0; a missing token
    adv = distill_advantages(teacher, STUDENT, MASK, discount=0.5)
    assert torch.isfinite(adv).all() and adv[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert reverse_kl(teacher, STUDENT, MASK) == pytest.approx((0 + 2) / 2)  # the two scored tokens only
