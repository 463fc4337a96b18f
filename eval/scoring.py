"""One model scored on what a stage compares it by: validation loss, held-out answers and loss, a suite.

The quantize stage scores the BF16 model and every quantized candidate the same way (a `Scoring`
says on what), so "kept" compares like with like; `stagewise quantize` does the same outside a flow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stagewise.eval.harness import run_tasks
from stagewise.eval.heldout import answer_metrics, answer_results, heldout_loss
from stagewise.eval.intervals import Scored
from stagewise.eval.metric_names import ANSWER_SCORES
from stagewise.eval.validation import validation_loss


@dataclass
class Scoring:
    """What a model is scored on, BF16 and quantized alike."""

    streams: dict[str, np.ndarray] = field(default_factory=dict)
    """Validation token streams (validation loss over their first `val_tokens`)."""
    seq_length: int = 256
    val_tokens: int = 16384
    heldout: list[dict] = field(default_factory=list)
    """The held-out conversations' test split (greedy exact match, eval/heldout.py; eval/splits.py)."""
    heldout_limit: int | None = 200
    pack_size: int = 1024
    """Pack size of the held-out loss (the conversations' SFT loss, packed as SFT trains them)."""
    suite: list[str] = field(default_factory=list)
    suite_limit: int | None = 40


def score_model(model: torch.nn.Module, tokenizer: Any, scoring: Scoring, device: str) -> Scored:
    """`validation/loss`, `test/exact_match` (+ format match, per domain), `test/loss` (the
    assistant tokens' loss: the smoothest of these, so the one that ranks budgets) and the suite's
    `<task>/<metric>`; each held-out conversation's exact and format match are the items of those."""
    out: dict[str, float] = {}
    items: dict[str, dict[str, float]] = {}
    if scoring.streams:
        out["validation/loss"] = validation_loss(model, scoring.streams, scoring.seq_length, scoring.val_tokens,
                                                 device=device)["loss"]
    if scoring.heldout:
        results = answer_results(model, tokenizer, scoring.heldout, scoring.heldout_limit, device=device)
        out |= {f"test/{k}": v for k, v in answer_metrics(results).items() if k != "answered"}
        if results:
            items = {f"test/{name}": {key: r[name] for key, r in results.items()} for name in ANSWER_SCORES}
        loss = heldout_loss(model, tokenizer, scoring.heldout, scoring.pack_size, scoring.heldout_limit, device=device)
        if loss:
            out["test/loss"] = loss["loss"]
    if scoring.suite:
        out |= run_tasks(model, tokenizer, scoring.suite, limit=scoring.suite_limit, device=device).metrics
    return Scored(out, items)
