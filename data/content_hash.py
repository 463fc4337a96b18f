"""The one hash that names content-addressed things: stage steps, data directories, held-out scores.

A name is the hash over the spec a thing is built from and its inputs' hashes (Marin's executor
rule). Output locations and bookkeeping (`out_dir`, `workdir`, run ids, the tracker) never enter
it, so moving a workdir or pointing at another MLflow store names the same thing. It lives in the
data library (not store/) because libraries name their own cached results with it too (the
held-out scores of eval/rl_scoring.py), and libraries import nothing of the orchestration rooms.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

HASH_CHARS = 16
OUTPUT_KEYS = frozenset({"out_dir", "workdir", "tracker", "run_id", "parent_run_id", "review", "review_timeout_s"})
"""Keys that say where results go, or who decides (a gate's `review`: a person's answer is recorded with
the step, not planned in it), not what they are: dropped from a spec before hashing."""


def canonical(spec: Any) -> Any:
    """`spec` as plain JSON data: pydantic models dumped, output keys dropped, at every depth."""
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump(mode="json", by_alias=True)
    if isinstance(spec, dict):
        return {str(k): canonical(v) for k, v in spec.items() if k not in OUTPUT_KEYS}
    if isinstance(spec, (list, tuple)):
        return [canonical(v) for v in spec]
    if isinstance(spec, Path):
        return str(spec)
    if spec is None or isinstance(spec, (str, int, float, bool)):
        return spec
    raise TypeError(f"cannot hash a {type(spec).__name__} into a step spec")


def step_hash(kind: str, spec: Any, inputs: Iterable[str] = ()) -> str:
    """The hash naming a step of `kind` built from `spec` and upstream hashes `inputs`."""
    blob = json.dumps({"kind": kind, "spec": canonical(spec), "inputs": list(inputs)},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_CHARS]
