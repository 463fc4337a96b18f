"""GRPO on verifiable rewards (ALGORITHMS.md section 5): the policy-gradient loss of one update.

The rollout side (generation, rewards, advantages) hands the engine a `RolloutBatch`; this
objective turns each micro-batch of it into its share of the global loss. Per response
token t (the target input_ids[:, t+1]), with A the sample's advantage:

    rho_t = exp(logp_t - old_t)                    old = old_logprobs, or logp.detach() (rho = 1)
    w_t   = exp(train_t - rollout_t) if is_low <= w_t <= is_high else 0      (detached)
            train_t = old_t (the weights that generated the rollout, scored by the trainer)
    L_t   = w_t * max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))
            + kl_coeff * k3_t,   k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1

    L = sum over response tokens of the global batch of L_t / N,
    N = number of response tokens in the global batch (response_mask summed, clamped to >= 1)

Why the masked-IS tokens stay in N: the denominator is fixed before any backward pass
(objectives/__init__.py) and must not depend on the weights being trained, while the IS
mask is only known after each micro-batch's forward. Keeping them also means a token whose
rollout probability disagrees with the trainer's simply contributes no gradient (like a
clipped token), instead of silently scaling up every other token's gradient in steps with
a large rollout/training mismatch. The same holds for zero-advantage samples (groups whose
rewards are all equal): they count in N if the rollout side leaves them in the batch.

The KL term is weighted by the response mask only, not by w: it regularises the current
policy on every sampled token, whichever engine produced it.

Because every term is a sum over tokens divided by the global N, splitting the global
batch into micro-batches changes neither the loss nor the gradient
(tests/model/test_grpo_objective.py). The MoE balance loss, when the context has a routing
monitor, is weighted by the micro-batch's share of N, as in the other objectives.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

import torch
from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.model.objectives.auxiliary import add_auxiliary
from stagewise.model.packed import causal_lm

if TYPE_CHECKING:
    from stagewise.model.objectives import LossContext

REQUIRED = ("input_ids", "response_mask", "advantages", "rollout_logprobs")
OPTIONAL = ("old_logprobs", "ref_logprobs")
Micro = Mapping[str, torch.Tensor]


class RolloutBatch(dict):
    """A global batch of rollouts: input_ids [n, L] long (prompt + response, right-padded),
    response_mask [n, L-1] float (1 where the target input_ids[:, 1:] is a response token),
    advantages [n], rollout_logprobs [n, L-1] (0 outside the response), and optionally
    old_logprobs / ref_logprobs [n, L-1]. `advantages` may also be per token, [n, L-1]
    (on-policy distillation, model/objectives/distill.py). Like data/sft_packs.py's PackedBatch it answers the
    engine's three tensor calls (`.to`, `.split`, `.device`), splitting every tensor on dim 0."""

    def to(self, device, non_blocking: bool = False) -> "RolloutBatch":
        return RolloutBatch({k: v.to(device, non_blocking=non_blocking) for k, v in self.items()})

    def split(self, size: int) -> tuple["RolloutBatch", ...]:
        parts = {k: v.split(size) for k, v in self.items()}
        return tuple(RolloutBatch({k: parts[k][i] for k in parts}) for i in range(len(parts["input_ids"])))

    def parts(self, k: int) -> list["RolloutBatch"]:
        """k parts of (nearly) equal rows, shortest rows first: one optimizer step each when a rollout
        batch is reused (RolloutSettings.minibatches). Each part is its own global batch (its loss
        normalised by its own response tokens) and is cut to its longest row, so a part of short
        prompts does not pay for the padding of long ones (right padding: the cut columns are
        targets no row supervises, and a causal model's earlier positions do not see them)."""
        used = self["response_mask"].gt(0).flip(1).float().argmax(1)  # trailing unsupervised targets per row
        width = self["response_mask"].shape[1] - used  # targets up to the last response token
        order = torch.sort(width, stable=True).indices
        parts = []
        for rows in order.tensor_split(k):
            w = int(width[rows].max()) if len(rows) else 1
            parts.append(RolloutBatch({key: v[rows][:, :w + 1] if key == "input_ids"
                                       else v[rows] if v.dim() == 1 else v[rows][:, :w] for key, v in self.items()}))
        return parts

    @property
    def device(self) -> torch.device:
        return self["input_ids"].device

    def validate(self) -> "RolloutBatch":
        """Raise ValueError naming the key when a tensor is missing or has the wrong shape."""
        for key in REQUIRED:
            if key not in self:
                raise ValueError(f"RolloutBatch: missing {key!r}")
        unknown = set(self) - set(REQUIRED) - set(OPTIONAL)
        if unknown:
            raise ValueError(f"RolloutBatch: unknown keys {sorted(unknown)}")
        ids = self["input_ids"]
        if ids.dim() != 2 or ids.shape[1] < 2:
            raise ValueError(f"RolloutBatch: input_ids must be [n, L >= 2], got {tuple(ids.shape)}")
        n, length = ids.shape
        want = {"advantages": (n,) if self["advantages"].dim() == 1 else (n, length - 1)}
        want.update({k: (n, length - 1) for k in ("response_mask", "rollout_logprobs", *OPTIONAL)})
        for key, shape in want.items():
            if key in self and tuple(self[key].shape) != shape:
                raise ValueError(f"RolloutBatch: {key} must be {list(shape)}, got {list(self[key].shape)}")
        return self


def leave_one_out(rewards: torch.Tensor, scale_by_std: bool = False) -> torch.Tensor:
    """Advantages of one group of G samples (or of [..., G] groups along the last dim).

    A_i = r_i - b_i with the leave-one-out baseline b_i = (sum_j r_j - r_i) / (G - 1), the mean
    of the *other* samples (equivalently A_i = G/(G-1) (r_i - mean r)). This is the definition
    that reproduces ALGORITHMS.md's example: r = [1,0,0,1,1,0,0,0] gives +5/7 = +0.714 for a
    correct sample (b = 2/7) and -3/7 = -0.429 for a wrong one (b = 3/7). With scale_by_std the
    advantages are divided by the group's sample standard deviation (Bessel-corrected) + 1e-6.
    A group whose rewards are all equal gets 0 everywhere, and so does a group of one sample
    (no baseline exists)."""
    rewards = rewards.float()
    g = rewards.shape[-1]
    if g < 2:
        return torch.zeros_like(rewards)
    baseline = (rewards.sum(-1, keepdim=True) - rewards) / (g - 1)
    adv = rewards - baseline
    if scale_by_std:
        adv = adv / (rewards.std(-1, keepdim=True) + 1e-6)
    return adv


def is_weights(logp_train: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
               lo: float = 0.5, hi: float = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked importance-sampling weights for the rollout/training mismatch.

    w = exp(logp_train - logp_rollout), detached. A token is kept iff it is in `mask` and
    lo <= w <= hi (both ends inclusive, compared in log space so a ratio of exactly lo or hi
    is kept whatever the rounding of exp). Returns (w with 0 wherever not kept, the kept mask
    as a float tensor of w's dtype)."""
    if not 0 < lo <= hi:
        raise ValueError(f"is_weights: need 0 < lo <= hi, got lo={lo}, hi={hi}")
    log_w = (logp_train.detach() - logp_rollout.detach()).float()
    kept = (mask > 0) & (log_w >= math.log(lo)) & (log_w <= math.log(hi))
    w = torch.exp(torch.where(kept, log_w, torch.zeros_like(log_w)))  # no overflow where dropped
    kept = kept.to(log_w.dtype)
    return w * kept, kept


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, temperature: float = 1.0,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([n, L-1] log pi(input_ids[:, t+1] | prefix) at logits / temperature, [n, L-1] entropy
    of that same distribution, detached), in float32. Right padding does not change earlier
    positions (the model is causal), so the padded tail is simply masked by the caller.

    With `mask` ([n, L-1]), only the targets where it is > 0 get logits, and both outputs are 0
    elsewhere: the output layer, the softmax and their backward then run on the response tokens
    alone. A rollout row is mostly prompt (the demo's: ~40 prompt tokens, ~6 sampled), and the
    [n, L-1, V] logits were the largest part of an RL step's compute."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    targets, lm = input_ids[:, 1:], causal_lm(model)
    if mask is None or not hasattr(lm, "lm_head"):  # a stand-in that only answers logits: all of them
        mask = None
        logits = model(input_ids).logits[:, :-1].float()
    else:
        keep = mask > 0
        hidden = lm.model(input_ids=input_ids, use_cache=False).last_hidden_state[:, :-1]
        logits, targets = lm.lm_head(hidden[keep]).float(), targets[keep]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets[..., None].long()).squeeze(-1)
    with torch.no_grad():  # a metric: no [n, L-1, V] graph kept for it
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    if mask is not None:  # back to [n, L-1], zeros outside the mask
        zeros = torch.zeros(mask.shape, dtype=logp.dtype, device=logp.device)
        logp, entropy = zeros.masked_scatter(keep, logp), zeros.masked_scatter(keep, entropy)
    return logp, entropy


def _mismatch_sum(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ |old - rollout| over the response tokens whose sampler log-prob is a number."""
    diff = (old.float() - rollout.float()).abs()
    return torch.where((mask > 0) & torch.isfinite(diff), diff, torch.zeros_like(diff)).sum()


def k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per sampled token: exp(d) - d - 1, d = ref - logp (>= 0)."""
    d = ref - logp
    return torch.exp(d) - d - 1


class GRPOConfig(StrictConfig):
    """The knobs of the GRPO loss (defaults: ALGORITHMS.md section 5)."""


    eps_low: float = Field(0.2, ge=0, lt=1, description="lower clip: rho >= 1 - eps_low")
    eps_high: float = Field(0.28, ge=0, description="upper clip: rho <= 1 + eps_high")
    is_low: float = Field(0.5, gt=0, description="masked IS: keep tokens with w >= is_low")
    is_high: float = Field(5.0, gt=0, description="masked IS: keep tokens with w <= is_high")
    kl_coeff: float = Field(0.0, ge=0, description="weight of the k3 KL to the reference (0 = off)")
    temperature: float = Field(1.0, gt=0, description="the rollout temperature the log-probs are taken at")

    @model_validator(mode="after")
    def _is_range(self) -> "GRPOConfig":
        if self.is_low > self.is_high:
            raise ValueError(f"is_low ({self.is_low}) must be <= is_high ({self.is_high})")
        return self


class GRPOObjective:
    """Clipped policy gradient with masked IS and optional k3 KL; see the module docstring.

    Metrics (detached shares that sum over micro-batches to the step's value): pg_loss (the
    IS-weighted clipped term), kl (mean k3 over response tokens; 0 without ref_logprobs),
    entropy (mean over response tokens), ratio_mean (mean rho), clip_fraction (kept tokens
    whose clipped branch is the active one, i.e. that get no gradient from the clip),
    is_masked_fraction (response tokens dropped by the IS mask), logprob_mismatch (mean |log π_old -
    log π_rollout| over response tokens: the trainer's log-prob of a sampled token, under the weights
    that sampled it, against the sampler's own; vLLM's kernels or bf16 against the trainer's fp32, plus
    one optimizer step where off-policy batches carry no π_old; a token the sampler could not score,
    NaN, counts 0 here and as masked above), response_tokens (a count),
    and lb_loss with a routing monitor."""

    def __init__(self, cfg: GRPOConfig | None = None, lb_loss_coeff: float = 0.0) -> None:
        self.cfg = cfg or GRPOConfig()
        self.lb_loss_coeff = float(lb_loss_coeff)

    def denominator(self, micro_batches: Sequence[Micro]) -> torch.Tensor:
        """Response tokens in the global batch (masked-IS tokens included), clamped to >= 1."""
        return torch.stack([m["response_mask"].sum() for m in micro_batches]).sum().clamp(min=1).float()

    def loss(self, model: torch.nn.Module, micro: Micro, denom: float | torch.Tensor,
             ctx: "LossContext") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cfg = self.cfg
        mask = micro["response_mask"].float()
        logp, entropy = token_logprobs(model, micro["input_ids"], cfg.temperature, mask=mask)
        old = micro.get("old_logprobs")
        old = logp.detach() if old is None else old.float()
        w, kept = is_weights(old, micro["rollout_logprobs"], mask, cfg.is_low, cfg.is_high)

        adv = micro["advantages"].float()
        adv = adv[:, None] if adv.dim() == 1 else adv  # per sample (GRPO) or per token (distillation)
        on = mask > 0  # garbage old/ref values outside the response must not overflow exp
        rho = torch.exp(torch.where(on, logp - old, torch.zeros_like(logp)))
        clipped_rho = rho.clamp(1 - cfg.eps_low, 1 + cfg.eps_high)
        unclipped, clipped = -adv * rho, -adv * clipped_rho
        pg = torch.maximum(unclipped, clipped)
        pg_sum = (w * pg).sum()  # w is 0 outside the response and on masked tokens

        total = pg_sum / denom
        ref = micro.get("ref_logprobs")
        if ref is not None:
            kl_sum = (mask * k3(logp, torch.where(on, ref.float(), logp.detach()))).sum()
            if cfg.kl_coeff > 0:
                total = total + cfg.kl_coeff * kl_sum / denom
        else:
            kl_sum = logp.new_zeros(())

        n_tokens = mask.sum()
        share = n_tokens / denom
        with torch.no_grad():
            is_clipped = (clipped > unclipped) & (kept > 0)
            metrics = {
                "pg_loss": pg_sum.detach() / denom,
                "kl": kl_sum.detach() / denom,
                "entropy": (mask * entropy).sum() / denom,
                "ratio_mean": (mask * rho).sum() / denom,
                "clip_fraction": is_clipped.sum() / denom,
                "is_masked_fraction": (mask - kept).sum() / denom,
                "logprob_mismatch": _mismatch_sum(old, micro["rollout_logprobs"], mask) / denom,
                "response_tokens": n_tokens,
            }
        total = add_auxiliary(total, metrics, share, self.lb_loss_coeff, ctx, None, lambda: [])
        return total, metrics
