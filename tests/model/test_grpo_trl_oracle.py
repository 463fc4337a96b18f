"""TRL as an oracle for our GRPO loss (dev-only: skipped where `trl` is not installed).

Where the two definitions coincide, TRL's GRPOTrainer computes the same loss as our
GRPOObjective: loss_type "dapo" (token-level: the sum over every response token of the
batch divided by their count), token-level ratio, two-sided clip eps_low / eps_high, no KL
(beta 0), and vLLM importance-sampling correction in "token_mask" mode (the weight
exp(old - sampling) multiplies each token's loss, and is 0 outside [clip_min, clip_max]),
which is our masked IS with is_low / is_high.

How TRL is called: GRPOTrainer's loss is a method (`_compute_loss`) that reads its settings
from the trainer, and a real trainer needs a dataset, reward functions and an accelerator.
We call TRL's own, unmodified `GRPOTrainer._compute_loss` and
`GRPOTrainer._get_per_token_logps_and_entropies` (their log-probs at logits / temperature)
on a stand-in `self` holding exactly the attributes those two methods read, with one
process and one accumulation step. The only TRL code we reproduce by hand is the five
lines of `_generate_and_score_completions` that turn old and sampling log-probs into the
"token_mask" importance ratio (it sits in the middle of that generation method and cannot
be called alone); they are copied in `trl_token_mask_ratio` below.

Mapping of one batch: TRL's prompt_ids / completion_ids are our input_ids split after the
prompt (every prompt here has the same length, so no left padding), its completion_mask is
our response_mask from position len(prompt) - 1, its old_per_token_logps our old_logprobs,
its sampling logprobs our rollout_logprobs, its num_items_in_batch our denominator.
"""

from __future__ import annotations

import copy
import functools
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

from stagewise.model.objectives import LossContext  # noqa: E402
from stagewise.model.objectives.grpo import GRPOConfig, GRPOObjective, RolloutBatch, token_logprobs  # noqa: E402

PROMPT, COMPLETION, ROWS, VOCAB = 5, 7, 6, 64


class _OneProcess:
    """The accelerator calls `_compute_loss` makes, for a single process."""

    num_processes = 1
    sync_gradients = True
    is_main_process = True

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather


def trl_self(model: torch.nn.Module, cfg: GRPOConfig) -> SimpleNamespace:
    """A stand-in GRPOTrainer with the settings under which TRL's loss is ours."""
    fake = SimpleNamespace(
        model=model, model_kwarg_keys=set(), temperature=cfg.temperature, loss_type="dapo",
        importance_sampling_level="token", epsilon_low=cfg.eps_low, epsilon_high=cfg.eps_high, beta=0.0,
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=True,
        vllm_importance_sampling_correction=True, aux_loss_enabled=False, _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1, accelerator=_OneProcess(),
        args=SimpleNamespace(delta=None, steps_per_generation=1, use_bias_correction_kl=False),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    fake._get_per_token_logps_and_entropies = functools.partial(
        trl_grpo.GRPOTrainer._get_per_token_logps_and_entropies, fake)
    return fake


def trl_token_mask_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, lo: float,
                         hi: float) -> torch.Tensor:
    """TRL's vLLM importance ratio in "token_mask" mode (copied from GRPOTrainer._generate_and_score_completions)."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    ratio = torch.exp(diff)
    return ratio.masked_fill((ratio < (lo if lo is not None else -math.inf)) | (ratio > hi), 0.0)


def toy(model: torch.nn.Module, temperature: float, seed: int = 0) -> tuple[RolloutBatch, dict]:
    """One batch in both layouts: responses of different lengths (right-padded), advantages of both
    signs, old log-probs off the current ones by up to 0.4 nats (both clips active) and sampling
    log-probs off the old ones by up to 1.2 nats (some tokens outside [0.5, 5]: IS-masked)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (ROWS, PROMPT + COMPLETION), generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 7])
    completion_mask = (torch.arange(COMPLETION)[None] < lengths[:, None]).float()
    ids[:, PROMPT:] = torch.where(completion_mask > 0, ids[:, PROMPT:], torch.zeros_like(ids[:, PROMPT:]))
    response_mask = torch.cat([torch.zeros(ROWS, PROMPT - 1), completion_mask], 1)
    with torch.no_grad():
        current, _ = token_logprobs(model, ids, temperature)
    old = (current + (torch.rand(current.shape, generator=g) - 0.5) * 0.8) * response_mask
    rollout = (old + (torch.rand(current.shape, generator=g) - 0.5) * 2.4) * response_mask
    advantages = torch.tensor([0.714, -0.429, 1.0, -1.0, 0.25, -0.6])
    ours = RolloutBatch(input_ids=ids, response_mask=response_mask, advantages=advantages,
                        rollout_logprobs=rollout, old_logprobs=old).validate()
    cut = slice(PROMPT - 1, None)
    theirs = {
        "prompt_ids": ids[:, :PROMPT], "prompt_mask": torch.ones(ROWS, PROMPT, dtype=torch.long),
        "completion_ids": ids[:, PROMPT:], "completion_mask": completion_mask.long(),
        "advantages": advantages, "old_per_token_logps": old[:, cut],
        "num_items_in_batch": completion_mask.sum(),
    }
    return ours, theirs


@pytest.fixture(scope="module")
def model():
    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    torch.manual_seed(0)
    return build_model(ModelConfig(preset="tiny"), vocab_size=VOCAB, seed=0).train()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_our_grpo_loss_and_gradients_equal_trls_dapo_loss(model, temperature):
    cfg = GRPOConfig(temperature=temperature)
    ours_model, trl_model = copy.deepcopy(model), copy.deepcopy(model)
    batch, inputs = toy(ours_model, temperature)
    cut = slice(PROMPT - 1, None)
    inputs["importance_sampling_ratio"] = trl_token_mask_ratio(
        batch["old_logprobs"][:, cut], batch["rollout_logprobs"][:, cut], inputs["completion_mask"].float(),
        cfg.is_low, cfg.is_high)
    masked = ((inputs["importance_sampling_ratio"] == 0) & (inputs["completion_mask"] > 0)).sum()
    assert 0 < masked < inputs["completion_mask"].sum()  # the IS mask is exercised, not everything dropped

    objective = GRPOObjective(cfg)
    ours, metrics = objective.loss(ours_model, batch, objective.denominator([batch]), LossContext())
    fake = trl_self(trl_model, cfg)
    theirs = trl_grpo.GRPOTrainer._compute_loss(fake, trl_model, inputs)

    assert metrics["clip_fraction"] > 0  # the clip is exercised too
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert metrics["entropy"].item() == pytest.approx(fake._metrics["train"]["entropy"][0], rel=1e-5)
    ours.backward()
    theirs.backward()
    grads = [(name, a.grad, b.grad) for (name, a), (_, b) in zip(ours_model.named_parameters(),
                                                                 trl_model.named_parameters()) if a.grad is not None]
    assert max(g.abs().max().item() for _, g, _ in grads) > 1e-3  # gradients worth comparing
    for name, a, b in grads:  # float32 noise only: TRL passes an attention mask, we do not
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_trl_oracle_sees_a_different_clip_as_a_different_loss(model):
    """The comparison can fail: TRL with a narrower upper clip disagrees with our default one."""
    cfg = GRPOConfig()
    batch, inputs = toy(model, 1.0, seed=1)
    cut = slice(PROMPT - 1, None)
    inputs["importance_sampling_ratio"] = trl_token_mask_ratio(
        batch["old_logprobs"][:, cut], batch["rollout_logprobs"][:, cut], inputs["completion_mask"].float(),
        cfg.is_low, cfg.is_high)
    objective = GRPOObjective(cfg)
    with torch.no_grad():
        ours, _ = objective.loss(model, batch, objective.denominator([batch]), LossContext())
        theirs = trl_grpo.GRPOTrainer._compute_loss(trl_self(model, GRPOConfig(eps_high=0.05)), model, inputs)
    assert not torch.allclose(ours, theirs, rtol=1e-4, atol=1e-6)
