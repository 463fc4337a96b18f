"""Which checkpoints a merge window holds (ALGORITHMS.md §2).

Windows are measured in tokens, not checkpoints, so the same window means the same thing
whatever the checkpoint interval. The window ending at checkpoint e takes every checkpoint
with tokens_seen ≥ tokens(e) − window and ≤ tokens(e), inclusive at both ends: a window of
5 checkpoint intervals holds 6 checkpoints.

A window "does not fit yet" when the oldest checkpoint available is newer than the
window's start: merging what is there would silently be a shorter window, so the caller
gets no members and a reason instead (early in a run, or after pruning with
keep_checkpoints).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stagewise.model.checkpoint import list_checkpoints, read_meta
from stagewise.model.merge.errors import MergeInputError


@dataclass(frozen=True)
class Window:
    """The outcome of `select_window`: members (oldest first) or None, and why."""

    members: list[tuple[Path, int]] | None
    """(checkpoint, tokens_seen) in the window, oldest first; None when the window does not fit yet."""
    reason: str
    """What was selected, or why nothing was."""
    start_tokens: int
    """tokens(end) − window_tokens: the oldest tokens_seen a member may have."""
    end_tokens: int
    """tokens_seen of the window's last checkpoint."""

    @property
    def fits(self) -> bool:
        return self.members is not None

    @property
    def paths(self) -> list[Path]:
        return [p for p, _ in self.members or []]


def select_window(
    checkpoints_with_tokens: Sequence[tuple[str | os.PathLike, int]],
    end: str | os.PathLike | int,
    window_tokens: int,
) -> Window:
    """The window of `window_tokens` ending at `end` (a checkpoint path or an index into the list).

    `checkpoints_with_tokens` is (path, tokens_seen) in any order; it is sorted by tokens.
    """
    if window_tokens < 0:
        raise MergeInputError(f"window_tokens must be >= 0, got {window_tokens}")
    ckpts = sorted(((Path(p), int(t)) for p, t in checkpoints_with_tokens), key=lambda pt: (pt[1], str(pt[0])))
    if not ckpts:
        raise MergeInputError("no checkpoints to choose a window from")
    end_path, end_tokens = _find_end(ckpts, checkpoints_with_tokens, end)
    start = end_tokens - window_tokens
    oldest_path, oldest_tokens = ckpts[0]
    if oldest_tokens > start:
        why = (f"window of {window_tokens:,} tokens ending at {end_path.name} ({end_tokens:,} tokens) starts at "
               f"{start:,} tokens, but the oldest checkpoint available, {oldest_path.name}, is at "
               f"{oldest_tokens:,}: does not fit yet")
        return Window(None, why, start, end_tokens)
    members = [(p, t) for p, t in ckpts if start <= t <= end_tokens]
    why = f"{len(members)} checkpoints from {members[0][1]:,} to {end_tokens:,} tokens"
    return Window(members, why, start, end_tokens)


def _find_end(ckpts: list[tuple[Path, int]], given: Sequence, end) -> tuple[Path, int]:
    if isinstance(end, int) and not isinstance(end, bool):
        try:
            path, tokens = given[end]
        except IndexError:
            raise MergeInputError(f"end index {end} is out of range for {len(given)} checkpoints") from None
        return Path(path), int(tokens)
    for path, tokens in ckpts:
        if path == Path(end):
            return path, tokens
    raise MergeInputError(f"end checkpoint {end} is not among the checkpoints given")


def checkpoints_with_tokens(stage_dir: str | os.PathLike) -> list[tuple[Path, int]]:
    """(checkpoint, tokens_seen) of every complete checkpoint of a stage, oldest first."""
    return [(p, read_meta(p).tokens_seen) for p in list_checkpoints(stage_dir)]


def order_by_tokens(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """`paths` oldest first by their stagewise.json tokens_seen (stable); as given when any lacks one.

    Plain Hugging Face checkpoints carry no token count, so their order is the caller's.
    """
    tokens = []
    for p in map(Path, paths):
        meta = p / "stagewise.json"
        tokens.append(json.loads(meta.read_text()).get("tokens_seen") if meta.is_file() else None)
    if any(t is None for t in tokens):
        return [Path(p) for p in paths]
    return [Path(p) for _, p in sorted(zip(tokens, paths), key=lambda tp: tp[0])]
