"""Supervised fine-tuning on packed conversations, with the two normalisations of ALGORITHMS.md 4.

A micro-batch is a dict of [rows, pack_size] tensors from data/sft_packs.py: input_ids,
labels (already shifted: labels[t] is the target of position t, -100 where unsupervised
and at every conversation's last position), position_ids (restarting per conversation)
and seq_idx (conversation number within the row). The forward is model/packed.py's, so
conversations in one row do not see each other.

With m the supervised-label mask and l the per-token cross-entropy, over the *global* batch:
- "token" (stage 1):        L = sum_c sum_t m l / sum_c sum_t m
- "conversation" (stage 2): L = (1/N_conv) sum_c (sum_t m l / sum_t m)
`denominator` computes sum m (token) or N_conv (conversations with at least one label) over
every micro-batch before any backward; `loss` returns this micro-batch's numerator / denom.
A conversation never spans two micro-batches (rows are whole packs), so its own
normaliser sum_t m is local. Splitting the global batch differently therefore changes
neither the loss nor the gradient (tests/model/test_sft_objective.py).

The MoE balance loss and MTP heads (when the model has `model.mtp`) are per-micro-batch
means weighted by the micro-batch's share of the denominator, as in objectives/lm.py; MTP
targets that would cross a conversation boundary are masked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Mapping, Sequence

import torch
import torch.nn.functional as F

from stagewise.model.objectives.auxiliary import add_auxiliary
from stagewise.model.packed import causal_lm, packed_hidden

if TYPE_CHECKING:
    from stagewise.model.objectives import LossContext

IGNORE = -100
Micro = Mapping[str, torch.Tensor]


def conversation_sums(values: torch.Tensor, labels: torch.Tensor,
                      seq_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (row, seq_idx) conversation: (sum of `values` over supervised positions, label count),
    as flat vectors over every possible slot (slots without labels have count 0)."""
    rows, length = labels.shape
    slot = (seq_idx.long() + torch.arange(rows, device=labels.device)[:, None] * length).reshape(-1)
    mask = (labels != IGNORE).reshape(-1)
    sums = torch.zeros(rows * length, device=values.device, dtype=values.dtype)
    sums.index_add_(0, slot, values.reshape(-1) * mask)
    counts = torch.zeros(rows * length, device=labels.device, dtype=torch.long)
    counts.index_add_(0, slot, mask.long())
    return sums, counts


def conversations_with_labels(micro: Micro) -> torch.Tensor:
    """N_conv of one micro-batch (a tensor, no host sync)."""
    _, counts = conversation_sums(torch.zeros_like(micro["labels"], dtype=torch.float32), micro["labels"], micro["seq_idx"])
    return (counts > 0).sum()


class SFTObjective:
    """Packed SFT cross-entropy, token- or conversation-normalised; see the module docstring."""

    def __init__(self, normalization: Literal["token", "conversation"] = "token", lb_loss_coeff: float = 1e-3) -> None:
        if normalization not in ("token", "conversation"):
            raise ValueError(f"normalization must be 'token' or 'conversation', got {normalization!r}")
        self.normalization = normalization
        self.lb_loss_coeff = float(lb_loss_coeff)

    def _units(self, micro: Micro) -> torch.Tensor:
        """What this micro-batch contributes to the denominator."""
        if self.normalization == "token":
            return (micro["labels"] != IGNORE).sum()
        return conversations_with_labels(micro)

    def denominator(self, micro_batches: Sequence[Micro]) -> torch.Tensor:
        """Supervised tokens (token) or conversations with labels (conversation) in the global
        batch, as a float tensor (clamped to >= 1 so an all-masked batch gives 0, not NaN)."""
        total = torch.stack([self._units(m) for m in micro_batches]).sum()
        return total.clamp(min=1).float()

    def loss(self, model: torch.nn.Module, micro: Micro, denom: float | torch.Tensor,
             ctx: "LossContext") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """This micro-batch's share of the global loss; metrics: lm_loss, supervised_tokens,
        lb_loss, mtp{k}_loss (shares that sum to the step's value)."""
        ids, labels, seq_idx = micro["input_ids"], micro["labels"], micro["seq_idx"]
        hidden = packed_hidden(model, ids, micro.get("position_ids"), seq_idx)
        lm = causal_lm(model)
        # logits at the supervised positions only (a quarter of the demo's packed tokens): the output
        # layer, its softmax and their backward were the largest part of an SFT step
        supervised = labels != IGNORE
        logits = lm.lm_head(hidden[supervised]).float()
        ce = torch.zeros(labels.shape, dtype=logits.dtype, device=logits.device).masked_scatter(
            supervised, F.cross_entropy(logits, labels[supervised], reduction="none"))
        if self.normalization == "token":
            numerator = ce.sum()
        else:
            sums, counts = conversation_sums(ce, labels, seq_idx)
            numerator = (sums / counts.clamp(min=1)).sum()  # empty slots add 0
        total = numerator / denom
        share = self._units(micro) / denom
        metrics = {"lm_loss": total.detach(), "supervised_tokens": (labels != IGNORE).sum().float()}
        mtp = getattr(lm, "mtp", None)
        total = add_auxiliary(total, metrics, share, self.lb_loss_coeff, ctx, mtp,
                              lambda: mtp_losses(mtp, hidden, ids, labels, seq_idx, lm))
        return total, metrics


def mtp_losses(mtp, hidden: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor,
               seq_idx: torch.Tensor, lm: torch.nn.Module) -> list[torch.Tensor]:
    """model/mtp.py's per-head mean cross-entropy, with targets beyond the conversation masked."""
    embed, norm_f = lm.get_input_embeddings(), lm.model.norm_f
    seq = input_ids.shape[1]
    out, h = [], hidden
    for k, head in enumerate(mtp.heads, start=1):
        if seq - k <= 0:
            out.append(h.sum() * 0.0)
            continue
        h = head(h[:, : seq - k], embed(input_ids[:, k:]))
        target = labels[:, k:].masked_fill(seq_idx[:, k:] != seq_idx[:, :-k], IGNORE)
        logits = lm.lm_head(norm_f(h)).float()
        ce = F.cross_entropy(logits.flatten(0, 1), target.reshape(-1), ignore_index=IGNORE, reduction="sum")
        out.append(ce / (target != IGNORE).sum().clamp(min=1))
    return out
