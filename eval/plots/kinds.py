"""What a metric is, by its name: a rate (0-1), a loss, a count, or another score.

A chart that puts a count of 18,800 supervised tokens on the same axis as an exact match of
0.055 shows neither; every chart here first sorts its metrics by kind and gives each kind its
own axis: rates on a fixed 0-1 axis, losses on their own, counts apart.

    metric_kind("eval/sft_test/exact_match_arithmetic")  # "rate"
    metric_kind("eval/sft_test/supervised_tokens")        # "count"
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["rate", "loss", "count", "score"]
KINDS: tuple[Kind, ...] = ("rate", "loss", "count", "score")

RATES = ("exact_match", "format_match", "accuracy", "acc", "acc_norm", "reject_rate", "efficiency", "fraction",
         "answered_fraction", "f1", "precision", "recall", "pass_rate", "win_rate", "kept_fraction")
"""Names (or a name's first part, as in `exact_match_arithmetic`: per-domain) of metrics in [0, 1]."""
COUNTS = ("supervised_tokens", "answered", "packs", "tokens", "tokens_seen", "conversations", "lines", "bad_lines",
          "steps", "count", "docs", "samples", "items", "kept", "rejected", "params")
"""Names of metrics that count things; also anything ending in `_tokens`, `_count` or `_lines`."""
LOSSES = ("loss", "lm_loss", "nll", "mtp_loss")

AXIS_LABEL: dict[Kind, str] = {"rate": "rate (0 = none, 1 = all)", "loss": "loss (nats/token)", "count": "count",
                               "score": "score"}
HIGHER_IS_BETTER: dict[Kind, bool | None] = {"rate": True, "loss": False, "count": None, "score": None}


def _metric_part(name: str) -> str:
    """The metric's own name: `eval/task/acc_norm` -> acc_norm, `eval/gsm8k/exact_match/strict-match` ->
    exact_match, `sft/x/exact_match_delta` -> exact_match."""
    parts = [p for p in name.split("/") if p]
    for part in reversed(parts):
        base = part.removesuffix("_delta")
        if _family(base) is not None:
            return base
    return parts[-1].removesuffix("_delta") if parts else name


def _family(part: str) -> Kind | None:
    if part in LOSSES or part.endswith("_loss") or part.startswith("loss_"):
        return "loss"
    if part in COUNTS or part.endswith(("_tokens", "_count", "_lines")) or part.startswith(("n_", "num_")):
        return "count"
    if part in RATES or part.endswith(("_rate", "_fraction", "_accuracy")) or \
            any(part.startswith(f"{r}_") for r in RATES):
        return "rate"
    return None


def metric_kind(name: str, *values: float | None) -> Kind:
    """The kind of metric `name`; a would-be rate with a value outside [0, 1] is a plain score."""
    kind = _family(_metric_part(name)) or "score"
    if kind == "rate" and any(v is not None and not 0.0 <= v <= 1.0 for v in values):
        return "score"
    return kind


def split_by_kind(names: list[str], *dicts: dict[str, float]) -> dict[Kind, list[str]]:
    """`names` grouped by kind, in KINDS order, each group in the given order; empty groups left out."""
    groups: dict[Kind, list[str]] = {k: [] for k in KINDS}
    for name in names:
        groups[metric_kind(name, *(d.get(name) for d in dicts))].append(name)
    return {k: v for k, v in groups.items() if v}


def moved(before: float | None, after: float | None, higher_is_better: bool | None) -> int:
    """+1 when after is better than before, -1 when worse, 0 when equal, unknown or neither is better."""
    if before is None or after is None or higher_is_better is None or after == before:
        return 0
    return 1 if (after > before) == higher_is_better else -1
