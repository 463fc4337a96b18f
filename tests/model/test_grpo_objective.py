"""GRPO (ALGORITHMS.md section 5): leave-one-out advantages, the masked-IS boundaries, the
clipped loss on a toy batch against hand-computed values, its gradient, and invariance of
loss and gradient to how the global batch is split into micro-batches."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from stagewise.model.objectives import LossContext
from stagewise.model.objectives.grpo import (
    GRPOConfig,
    GRPOObjective,
    RolloutBatch,
    is_weights,
    leave_one_out,
    token_logprobs,
)
from stagewise.model.step import accumulate

LN = math.log


def test_leave_one_out_reproduces_the_algorithms_example():
    adv = leave_one_out(torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0]))
    assert adv.tolist() == pytest.approx([5 / 7, -3 / 7, -3 / 7, 5 / 7, 5 / 7, -3 / 7, -3 / 7, -3 / 7])
    assert round(adv[0].item(), 3) == 0.714 and round(adv[1].item(), 3) == -0.429


def test_leave_one_out_scaled_by_std_and_degenerate_groups():
    r = torch.tensor([1.0, 0, 0, 1, 1, 0, 0, 0])
    std = math.sqrt((3 * 0.625 ** 2 + 5 * 0.375 ** 2) / 7)  # Bessel-corrected, = 0.5175
    scaled = leave_one_out(r, scale_by_std=True)
    assert scaled[0].item() == pytest.approx((5 / 7) / (std + 1e-6), rel=1e-6)
    assert scaled[1].item() == pytest.approx((-3 / 7) / (std + 1e-6), rel=1e-6)
    assert leave_one_out(torch.ones(4), scale_by_std=True).tolist() == [0, 0, 0, 0]
    assert leave_one_out(torch.tensor([3.0])).tolist() == [0.0]
    two_groups = leave_one_out(torch.tensor([[1.0, 0, 0], [2.0, 2, 2]]))
    torch.testing.assert_close(two_groups, torch.tensor([[1.0, -0.5, -0.5], [0, 0, 0]]))


def test_is_mask_boundaries_are_inclusive():
    rollout = torch.zeros(1, 6)
    train = torch.tensor([[LN(0.5), LN(0.5) - 1e-3, LN(5.0), LN(5.0) + 1e-3, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 1, 1, 0]])
    w, kept = is_weights(train, rollout, mask, 0.5, 5.0)
    assert kept.tolist() == [[1.0, 0, 1, 0, 1, 0]]
    assert w[0].tolist() == pytest.approx([0.5, 0, 5.0, 0, 1.0, 0])
    assert not w.requires_grad


def test_is_weights_are_detached_and_finite_on_garbage_outside_the_mask():
    train = torch.tensor([[0.0, -300.0]], requires_grad=True)
    w, kept = is_weights(train, torch.tensor([[0.0, -1e4]]), torch.tensor([[1.0, 0.0]]))
    assert w.tolist() == [[1.0, 0.0]] and kept.tolist() == [[1.0, 0.0]] and not w.requires_grad


class FixedProbs(torch.nn.Module):
    """A two-token 'model' whose next-token distribution at each position is a given p(token 1),
    so log-probs of the targets are exactly log p or log(1 - p)."""

    def __init__(self, p1: list[list[float]]) -> None:
        super().__init__()
        p = torch.tensor(p1, dtype=torch.float64)
        self.logits = torch.nn.Parameter(torch.stack([torch.log1p(-p), torch.log(p)], dim=-1).float())

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.logits[: input_ids.shape[0]])


def toy_batch() -> tuple[FixedProbs, RolloutBatch]:
    """Row 0 (A = +1): rho 1.5 (clipped at 1.28) with w = 2; rho 1 with w = 10 (IS-masked).
    Row 1 (A = -0.5): rho 0.6 (clipped at 0.8) with w = 1; its last target is padding.
    Position 0 of each row is the prompt: its garbage old/rollout values must not matter."""
    model = FixedProbs([[0.5, 0.6, 0.5, 0.5], [0.5, 0.3, 0.5, 0.5]])
    batch = RolloutBatch(
        input_ids=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        response_mask=torch.tensor([[0.0, 1, 1], [0.0, 1, 0]]),
        advantages=torch.tensor([1.0, -0.5]),
        old_logprobs=torch.tensor([[-99.0, LN(0.4), LN(0.5)], [-99.0, LN(0.5), 0.0]]),
        rollout_logprobs=torch.tensor([[0.0, LN(0.2), LN(0.05)], [0.0, LN(0.5), 0.0]]),
    )
    return model, batch.validate()


def run(objective, model, micros):
    denom = objective.denominator(micros)
    total, sums = 0.0, {}
    for m in micros:
        loss, metrics = objective.loss(model, m, denom, LossContext())
        total = total + loss
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v.item()
    return total, sums


def test_toy_batch_loss_and_metrics_by_hand():
    model, batch = toy_batch()
    loss, m = run(GRPOObjective(), model, [batch])
    # tokens: 2 * max(-1.5, -1.28) = -2.56;  0 * (-1) (IS-masked);  1 * max(0.3, 0.4) = 0.4;  N = 3
    assert loss.item() == pytest.approx((-2.56 + 0.4) / 3, abs=1e-6)
    assert m["pg_loss"] == pytest.approx(-0.72, abs=1e-6)
    assert m["clip_fraction"] == pytest.approx(2 / 3)
    assert m["is_masked_fraction"] == pytest.approx(1 / 3)
    # |log π_old - log π_rollout| over the 3 response tokens: ln 2, ln 10, 0 (padding and prompt not counted)
    assert m["logprob_mismatch"] == pytest.approx(math.log(20) / 3, abs=1e-6)


def test_a_token_the_sampler_could_not_score_counts_zero_in_the_mismatch_and_as_masked():
    model, batch = toy_batch()
    batch["rollout_logprobs"][0, 1] = float("nan")  # vLLM answered None for it
    _, m = run(GRPOObjective(), model, [batch])
    assert m["logprob_mismatch"] == pytest.approx(math.log(10) / 3, abs=1e-6)
    assert m["is_masked_fraction"] == pytest.approx(2 / 3)
    assert m["ratio_mean"] == pytest.approx((1.5 + 1.0 + 0.6) / 3, abs=1e-6)
    assert m["kl"] == 0.0 and m["response_tokens"] == 3
    h = lambda p: -(p * LN(p) + (1 - p) * LN(1 - p))  # noqa: E731
    assert m["entropy"] == pytest.approx((h(0.6) + h(0.5) + h(0.3)) / 3, abs=1e-6)


def test_toy_batch_with_k3_kl():
    model, batch = toy_batch()
    batch["ref_logprobs"] = torch.tensor([[5.0, LN(0.3), LN(0.5)], [7.0, LN(0.3), -50.0]])
    loss, m = run(GRPOObjective(GRPOConfig(kl_coeff=0.1)), model, [batch])
    kl = 0.5 - LN(0.5) - 1  # k3 at ref/pi = 0.3/0.6; the other two response tokens have ref = pi
    assert m["kl"] == pytest.approx(kl / 3, abs=1e-6)
    assert loss.item() == pytest.approx(-0.72 + 0.1 * kl / 3, abs=1e-6)
    assert run(GRPOObjective(), model, [batch])[0].item() == pytest.approx(-0.72, abs=1e-6)  # kl_coeff 0: logged only


def test_token_logprobs_and_entropy_at_a_temperature(tiny_model):
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    logp, ent = token_logprobs(tiny_model, ids, temperature=0.7)
    with torch.no_grad():
        dist = torch.distributions.Categorical(logits=tiny_model(ids).logits[:, :-1].float() / 0.7)
    assert logp.shape == ent.shape == (2, 8) and logp.dtype == torch.float32
    torch.testing.assert_close(logp.detach(), dist.log_prob(ids[:, 1:]))
    torch.testing.assert_close(ent.detach(), dist.entropy())


def rollouts(model, n: int = 4, length: int = 10, seed: int = 0, old_noise: float = 0.0) -> RolloutBatch:
    """Prompts of 3 tokens, responses of different lengths, right-padded with 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 256, (n, length), generator=g)
    mask = torch.zeros(n, length - 1)
    for i in range(n):
        end = length - 1 - (i % 3) * 2
        mask[i, 2:end] = 1
        ids[i, end + 1:] = 0
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids)
    noise = old_noise * torch.randn(n, length - 1, generator=g)
    return RolloutBatch(input_ids=ids, response_mask=mask, advantages=torch.randn(n, generator=g),
                        old_logprobs=(logp + noise) * mask, rollout_logprobs=(logp + 2 * noise) * mask,
                        ref_logprobs=(logp - noise) * mask).validate()


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def test_on_policy_gradient_is_minus_advantage_times_grad_logp(tiny_model):
    """rho = 1 (no old_logprobs) and w = 1 (rollout = trainer log-probs): grad L = -sum A grad logp / N."""
    batch = rollouts(tiny_model)
    del batch["old_logprobs"], batch["ref_logprobs"]
    loss, _ = run(GRPOObjective(), tiny_model, [batch])
    loss.backward()
    got = grads(tiny_model)
    logp, _ = token_logprobs(tiny_model, batch["input_ids"])
    mask = batch["response_mask"]
    (-(batch["advantages"][:, None] * logp * mask).sum() / mask.sum()).backward()
    want = grads(tiny_model)
    assert any(w.abs().sum() > 0 for w in want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_micro_batch_split_changes_neither_loss_nor_gradient(tiny_model):
    batch = rollouts(tiny_model, n=4, old_noise=0.4)
    objective = GRPOObjective(GRPOConfig(kl_coeff=0.05))
    results = []
    for size in (4, 1, 3):
        loss, metrics = run(objective, tiny_model, batch.split(size))
        loss.backward()
        results.append((loss.item(), metrics, grads(tiny_model)))
    (loss0, m0, g0) = results[0]
    assert 0 < m0["clip_fraction"] and 0 < m0["is_masked_fraction"] < 1  # the toy exercises both
    for loss, metrics, g in results[1:]:
        assert loss == pytest.approx(loss0, rel=1e-5, abs=1e-7)
        for k in m0:
            assert metrics[k] == pytest.approx(m0[k], rel=1e-5, abs=1e-7), k
        for a, b in zip(g, g0):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_the_engine_step_accumulates_the_objective(tiny_model):
    batch = rollouts(tiny_model, n=4, old_noise=0.4)
    objective = GRPOObjective()
    sums = accumulate(tiny_model, objective, batch.split(2), LossContext(), None)
    loss, metrics = run(objective, tiny_model, [batch])
    assert sums["loss"].item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert sums["response_tokens"].item() == batch["response_mask"].sum().item()
    assert set(metrics) <= set(sums)


def test_rollout_batch_moves_splits_and_validates():
    _, batch = toy_batch()
    parts = batch.to("cpu").split(1)
    assert len(parts) == 2 and isinstance(parts[0], RolloutBatch) and parts[1]["advantages"].tolist() == [-0.5]
    assert parts[0].device == torch.device("cpu")
    bad = RolloutBatch(batch)
    bad["response_mask"] = bad["response_mask"][:, :2]
    with pytest.raises(ValueError, match="response_mask"):
        bad.validate()
    del bad["advantages"]
    with pytest.raises(ValueError, match="advantages"):
        bad.validate()


def test_config_rejects_an_empty_is_range():
    with pytest.raises(ValueError, match="is_low"):
        GRPOConfig(is_low=2.0, is_high=1.0)
    with pytest.raises(ValueError):
        GRPOConfig(bogus=1)


def test_masked_log_probs_are_the_full_ones_where_the_mask_is_set(model_factory):
    """token_logprobs with a mask runs the output layer on the masked targets only: the same
    values, entropies and gradients there as the full computation, zeros elsewhere."""
    model = model_factory(pattern="M*E-")
    ids = torch.randint(4, 200, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(3, 11)
    mask[0, 5:] = 1
    mask[1, 8:10] = 1
    mask[2, 2] = 1

    def run(masked: bool):
        model.zero_grad()
        logp, entropy = token_logprobs(model, ids, 0.7, mask=mask if masked else None)
        (logp * mask).sum().backward()
        return logp, entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    full, cut = run(False), run(True)
    on = mask > 0
    assert torch.allclose(cut[0][on], full[0][on], atol=1e-5) and torch.allclose(cut[1][on], full[1][on], atol=1e-5)
    assert cut[0][~on].abs().sum() == 0 and cut[1][~on].abs().sum() == 0
    assert full[2].keys() == cut[2].keys()
    for name, grad in full[2].items():
        assert torch.allclose(cut[2][name], grad, atol=1e-5), name
