"""Checkpoint merging: which checkpoints (window.py), with which weights (one file per
method: wsm.py, uniform.py; ordering.py for ablations), merged how (streaming.py).

    from stagewise.model.merge import merge_coefficients, merge_checkpoints, select_window
    window = select_window(checkpoints_with_tokens(stage_dir), end=-1, window_tokens=500_000)
    if window.fits:
        coeffs = merge_coefficients(len(window.paths), "minus-sqrt")
        merge_checkpoints(window.paths, coeffs, out_dir, "minus-sqrt", window_tokens=500_000)

The registry below maps a schedule name (the CLI's --schedule, a recipe's merge block) to
a function n -> coefficients by position, oldest checkpoint first.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from stagewise.model.merge.errors import MergeInputError
from stagewise.model.merge.layout import check_compatible, read_layout
from stagewise.model.merge.ordering import ORDERINGS, apply_ordering
from stagewise.model.merge.streaming import MANIFEST, merge_checkpoints
from stagewise.model.merge.uniform import uniform_coefficients
from stagewise.model.merge.window import Window, checkpoints_with_tokens, order_by_tokens, select_window
from stagewise.model.merge.wsm import cosine, decay_coefficients, linear, minus_sqrt

SCHEDULES: dict[str, Callable[[int], list[float]]] = {
    "minus-sqrt": partial(decay_coefficients, shape=minus_sqrt),
    "linear": partial(decay_coefficients, shape=linear),
    "cosine": partial(decay_coefficients, shape=cosine),
    "uniform": uniform_coefficients,
}
DEFAULT_SCHEDULE = "minus-sqrt"


def merge_coefficients(n: int, schedule: str = DEFAULT_SCHEDULE, ordering: str = "sequential",
                       seed: int = 0) -> list[float]:
    """Coefficients for n checkpoints (oldest first) under `schedule`, re-assigned by `ordering`."""
    if schedule not in SCHEDULES:
        raise MergeInputError(f"unknown merge schedule {schedule!r}; schedules: {', '.join(SCHEDULES)}")
    return apply_ordering(SCHEDULES[schedule](n), ordering, seed)


__all__ = ["DEFAULT_SCHEDULE", "MANIFEST", "ORDERINGS", "SCHEDULES", "MergeInputError", "Window",
           "check_compatible", "checkpoints_with_tokens", "merge_checkpoints", "merge_coefficients",
           "order_by_tokens", "read_layout", "select_window"]
