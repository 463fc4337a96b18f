"""Validation loss on held-out token streams: the pretraining stage's headline number.

Token streams are cut into non-overlapping windows of seq_length + 1 and scored with the
model's next-token cross-entropy. The loss is a token-weighted mean over the windows of all
sources, and each source's own loss is reported too, so a quality phase that trades one
source for another is visible. The streams are plain arrays: this module does not know
how shards are stored (data/ does), which keeps eval importable on its own.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from stagewise.data.prepare import PreparedData
from stagewise.data.shards import TokenShard


def _windows(tokens: np.ndarray, seq_length: int, max_tokens: int) -> torch.Tensor:
    """Non-overlapping [n, seq_length + 1] windows from the start of the stream."""
    usable = min(len(tokens), max_tokens + 1)
    n = (usable - 1) // seq_length
    if n == 0:
        return torch.empty(0, seq_length + 1, dtype=torch.long)
    starts = np.arange(n) * seq_length
    rows = [np.asarray(tokens[s : s + seq_length + 1], dtype=np.int64) for s in starts]
    return torch.from_numpy(np.stack(rows))


@torch.no_grad()
def stream_loss(model, windows: torch.Tensor, batch_size: int = 8, device: str = "cpu") -> tuple[float, int]:
    """Summed next-token cross-entropy (nats) and the number of scored tokens."""
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size].to(device)
        logits = model(input_ids=batch[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += batch[:, 1:].numel()
    return total, count


def validation_loss(
    model,
    streams: dict[str, np.ndarray],
    seq_length: int,
    max_tokens: int,
    batch_size: int = 8,
    device: str = "cpu",
) -> dict[str, float]:
    """`{"loss": ..., "<source>_loss": ...}` over at most `max_tokens` tokens split evenly over sources."""
    if not streams:
        raise ValueError("no validation streams given")
    per_source = max(seq_length, max_tokens // len(streams))
    was_training = model.training
    model.eval()
    try:
        out: dict[str, float] = {}
        grand_total, grand_count = 0.0, 0
        for name, tokens in sorted(streams.items()):
            total, count = stream_loss(model, _windows(tokens, seq_length, per_source), batch_size, device)
            if count:
                out[f"{name}_loss"] = total / count
                grand_total, grand_count = grand_total + total, grand_count + count
        if grand_count == 0:
            raise ValueError(f"validation streams are shorter than one sequence of {seq_length + 1} tokens")
        out["loss"] = grand_total / grand_count
        out["perplexity"] = math.exp(min(out["loss"], 50.0))
        return out
    finally:
        model.train(was_training)


def val_streams(prepared_root: Path) -> dict:
    """Every source's validation token stream of a prepared data directory (sources without one left out)."""
    prepared = PreparedData.load(prepared_root)
    return {name: TokenShard.open(src.val).tokens for name, src in prepared.sources.items() if src.val_tokens > 0}
