"""Random-number-generator state that survives `torch.load(weights_only=True)`.

An exact resume restores the Python, numpy and torch (CPU and CUDA) generators. Their
native states are tuples holding numpy arrays, which the safe unpickler refuses; here they
become lists, ints, floats and tensors, which it accepts.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) RNG states as tensors and plain types."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "words": list(words), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of capture_rng (a missing part is left as it is)."""
    if "python" in state:
        py = state["python"]
        random.setstate((py["version"], tuple(py["words"]), py["gauss"]))
    if "numpy" in state:
        n = state["numpy"]
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
