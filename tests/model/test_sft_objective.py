"""SFT loss normalisation (ALGORITHMS.md section 4): hand-computed values, and invariance of the
loss and gradient to how the global batch is split into micro-batches."""

from __future__ import annotations

import math

import pytest
import torch

from stagewise.model.objectives import LossContext
from stagewise.model.objectives.sft import SFTObjective

IGNORE = -100


class LossByToken(torch.nn.Module):
    """A stand-in causal LM whose cross-entropy at a position equals the input id there / 10
    when the label is 0: lm_head maps hidden l to logits [0, log(e^l - 1)], so p(0) = e^-l."""

    def __init__(self) -> None:
        super().__init__()
        self.model = self._Backbone()
        self.lm_head = self._Head()

    class _Backbone(torch.nn.Module):
        def forward(self, input_ids, position_ids=None, use_cache=False, seq_idx=None):
            return type("Out", (), {"last_hidden_state": (input_ids.float() / 10)[..., None]})

    class _Head(torch.nn.Module):
        def forward(self, hidden):
            return torch.cat([torch.zeros_like(hidden), torch.log(torch.expm1(hidden))], dim=-1)


def row(docs: list[tuple[int, int]], length: int) -> dict[str, torch.Tensor]:
    """One pack of documents (n supervised tokens, loss value) each followed by one unsupervised
    position (its last token), padded to `length`."""
    ids, labels, seq, pos = [], [], [], []
    for d, (n, loss) in enumerate(docs):
        ids += [int(loss * 10)] * (n + 1)
        labels += [0] * n + [IGNORE]
        seq += [d] * (n + 1)
        pos += list(range(n + 1))
    pad = length - len(ids)
    ids, labels, seq, pos = ids + [1] * pad, labels + [IGNORE] * pad, seq + [len(docs)] * pad, pos + list(range(pad))
    return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([pos]), "seq_idx": torch.tensor([seq], dtype=torch.int32)}


def cat(*micros):
    return {k: torch.cat([m[k] for m in micros]) for k in micros[0]}


def global_loss(objective, model, micros) -> float:
    denom = objective.denominator(micros)
    return sum(objective.loss(model, m, denom, LossContext())[0].item() for m in micros)


@pytest.mark.parametrize("normalization, expected", [("token", 1.9), ("conversation", 1.5)])
def test_algorithms_md_example(normalization, expected):
    """A: 10 supervised tokens of mean loss 1.0, B: 90 of mean 2.0 -> 1.9 token-level, 1.5 per conversation."""
    objective, model = SFTObjective(normalization), LossByToken()
    a, b = row([(10, 1.0)], 100), row([(90, 2.0)], 100)
    together = row([(10, 1.0), (90, 2.0)], 128)  # both in one pack
    assert global_loss(objective, model, [a, b]) == pytest.approx(expected)
    assert global_loss(objective, model, [cat(a, b)]) == pytest.approx(expected)
    assert global_loss(objective, model, [together]) == pytest.approx(expected)


def test_a_fully_masked_batch_gives_zero_not_nan():
    empty = row([], 8)
    for norm in ("token", "conversation"):
        objective = SFTObjective(norm)
        assert global_loss(objective, LossByToken(), [empty]) == 0.0


def test_metrics_are_additive_shares():
    objective, model = SFTObjective("token"), LossByToken()
    micros = [row([(10, 1.0)], 100), row([(90, 2.0)], 100)]
    denom = objective.denominator(micros)
    metrics = [objective.loss(model, m, denom, LossContext())[1] for m in micros]
    assert sum(m["lm_loss"].item() for m in metrics) == pytest.approx(1.9)
    assert sum(m["supervised_tokens"].item() for m in metrics) == 100


def packed_rows(n_rows: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Random packs of 1-4 documents with random supervision masks."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_rows):
        cuts = sorted(torch.randperm(length - 2, generator=g)[: int(torch.randint(0, 4, (1,), generator=g))].add(1).tolist())
        seq = torch.zeros(length, dtype=torch.int32)
        for c in cuts:
            seq[c:] += 1
        ids = torch.randint(3, 256, (length,), generator=g)
        labels = torch.where(torch.rand(length, generator=g) < 0.6, torch.roll(ids, -1), torch.full_like(ids, IGNORE))
        last = torch.ones(length, dtype=torch.bool)
        last[:-1] = seq[1:] != seq[:-1]
        labels[last] = IGNORE
        rows.append({"input_ids": ids[None], "labels": labels[None], "seq_idx": seq[None], "position_ids": None})
    out = {k: torch.cat([r[k] for r in rows]) for k in ("input_ids", "labels", "seq_idx")}
    from stagewise.model.packed import position_ids_from_seq_idx

    out["position_ids"] = position_ids_from_seq_idx(out["seq_idx"])
    return out


@pytest.mark.parametrize("normalization", ["token", "conversation"])
def test_micro_batch_split_changes_neither_loss_nor_gradient(normalization, model_factory):
    torch.manual_seed(0)
    model = model_factory()
    objective = SFTObjective(normalization, lb_loss_coeff=0.0)
    batch = packed_rows(4, 40, seed=1)
    results = []
    for micro_size in (4, 2, 1):
        model.zero_grad()
        micros = [{k: v[i:i + micro_size] for k, v in batch.items()} for i in range(0, 4, micro_size)]
        denom = objective.denominator(micros)
        total = 0.0
        for m in micros:
            loss, _ = objective.loss(model, m, denom, LossContext())
            loss.backward()
            total += loss.item()
        results.append((total, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    for total, grads in results[1:]:
        assert total == pytest.approx(results[0][0], rel=1e-5)
        for g, ref in zip(grads, results[0][1]):
            torch.testing.assert_close(g, ref, atol=1e-6, rtol=1e-4)
    assert math.isfinite(results[0][0]) and results[0][0] > 0


def test_conversation_loss_equals_mean_of_per_conversation_means(model_factory):
    """Ties the packed forward and the normaliser together against conversations run alone."""
    model = model_factory().eval()
    batch = packed_rows(2, 40, seed=3)
    with torch.no_grad():
        got = global_loss(SFTObjective("conversation"), model, [batch])
        means = []
        for r in range(2):
            for d in batch["seq_idx"][r].unique():
                where = batch["seq_idx"][r] == d
                labels = batch["labels"][r][where]
                if (labels != IGNORE).any():
                    logits = model(input_ids=batch["input_ids"][r][where][None]).logits[0]
                    means.append(torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE))
    assert got == pytest.approx(torch.stack(means).mean().item(), rel=1e-4)


def test_unknown_normalization():
    with pytest.raises(ValueError, match="normalization"):
        SFTObjective("sequence")


def test_mtp_heads_train_without_crossing_conversations(model_factory):
    from stagewise.model.mtp import attach_mtp
    from stagewise.model.objectives.sft import mtp_losses

    model = model_factory()
    attach_mtp(model, num_heads=2)
    batch = packed_rows(2, 40, seed=5)
    objective = SFTObjective("token", lb_loss_coeff=0.0)
    loss, metrics = objective.loss(model, batch, objective.denominator([batch]), LossContext())
    loss.backward()
    assert {"mtp1_loss", "mtp2_loss"} <= set(metrics)
    assert all(p.grad is not None for p in model.mtp.parameters())
    # a target one conversation later must not count: only a boundary separates these labels
    seq = torch.tensor([[0, 0, 1, 1]], dtype=torch.int32)
    labels = torch.tensor([[5, IGNORE, 7, IGNORE]])
    ids = torch.tensor([[3, 5, 6, 7]])
    hidden = model.model(input_ids=ids).last_hidden_state
    depth1 = mtp_losses(model.mtp, hidden, ids, labels, seq, model)[0]
    assert depth1.item() == 0.0  # t=1 -> labels[2] lies in conversation 1: masked; nothing else is valid


def test_the_engine_trains_packed_batches_unchanged(model_factory, tmp_path):
    """model.trainer.Trainer takes PackedBatches + SFTObjective as they are (no engine change)."""
    from stagewise.data.sft_packs import PackedBatches
    from stagewise.model.config import TrainConfig
    from stagewise.model.trainer import Trainer

    batch = packed_rows(8, 32, seed=7)
    rows = {k: v.numpy() for k, v in batch.items()}
    cfg = TrainConfig(tokens=4 * 32 * 4, seq_length=32, global_batch=4, micro_batch=2,
                      optimizer={"lr": 3e-3, "min_lr": 3e-5})
    model = model_factory()
    before = [p.detach().clone() for p in model.parameters()]
    logs = []
    trainer = Trainer(model, cfg, PackedBatches(rows, 4, seed=0), SFTObjective("conversation"), tmp_path, "sft",
                      None, "hash", log=logs.extend, progress=False)
    result = trainer.fit()
    assert result.step == 4 and all(math.isfinite(m["train/lm_loss"]) for _, _, m in logs)
    assert sum(m["train/supervised_tokens"] for _, _, m in logs) == sum(
        int((torch.from_numpy(rows["labels"]) != IGNORE).sum()) for _ in range(2))  # two epochs of 8 packs
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()) if p.requires_grad and p.numel() > 64)
