"""Small helpers shared by the demo-world generators: seeded RNGs and jsonl writing.

Every generator takes its own `random.Random` derived from (seed, kind), so adding a new
kind of document never changes the bytes of the existing ones.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from pathlib import Path


def rng_for(seed: int, kind: str) -> random.Random:
    """A Random seeded by (seed, kind), stable across Python versions and processes."""
    digest = hashlib.sha256(f"{seed}:{kind}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def write_jsonl(path: Path, texts: Iterable[str]) -> int:
    """Write `{"text": ...}` rows (one per text) and return how many were written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            n += 1
    return n
