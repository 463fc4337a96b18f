"""The one exception merging raises for input a person must fix (the CLI maps it to exit 2).

Kept apart so every merge module (coefficients, windows, layout checks, the streaming
merge) raises the same type without importing each other.
"""

from __future__ import annotations


class MergeInputError(ValueError):
    """Bad merge input: unknown schedule, mismatched checkpoints (the first mismatch named), ..."""
