"""The one memo of evaluation scores: what was scored once is never scored again.

Scoring a checkpoint is the slow part of every stage's evaluation (sampling held-out prompts,
running a suite), and the same weights are often asked for the same scores twice: SFT's last gate
evaluation and its end evaluation, RL's start and distillation's student (both SFT's checkpoint).
A memo entry is named by the content hash (data/content_hash.py) over what decides the scores
(the weights' sha256, the items, the settings), so a changed input is a new entry, never a stale one.

Kept in memory always; with a `root`, also on disk as `<root>/<kind>-<hash>/scores.json`, written
whole or not at all (a temporary sibling, then renamed), so a later run, or another stage of the
same run, reads it back. The caller logs what it gets, remembered or not, wherever it reports.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stagewise.data.content_hash import step_hash


class ScoreMemo:
    """Scores by (kind, spec): `get` computes once, then returns what it remembered."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else None
        self._remembered: dict[str, dict] = {}

    def path(self, kind: str, spec: Any) -> Path | None:
        """Where the entry lies on disk (None for a memory-only memo)."""
        if self.root is None:
            return None
        return self.root / f"{kind}-{step_hash(kind, spec)}" / "scores.json"

    def get(self, kind: str, spec: Any, compute: Callable[[], dict]) -> tuple[dict, Path | str | None]:
        """(scores, where they were remembered from): `compute()` runs only when neither memory nor
        disk holds this entry, and then the second item is None."""
        key = f"{kind}-{step_hash(kind, spec)}"
        if key in self._remembered:
            return self._remembered[key], "memory"
        path = self.path(kind, spec)
        if path is not None and path.is_file():
            scores = json.loads(path.read_text())
            self._remembered[key] = scores
            return scores, path.parent
        scores = compute()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}-{threading.get_ident()}")
            tmp.write_text(json.dumps(scores))
            tmp.replace(path)
        self._remembered[key] = scores
        return scores, None
