"""Calibration and scoring batches for quantization: token windows from validation streams or a text file.

The search needs labelled batches (its sensitivity scores are gradients of the LM loss) and the
quantizers need representative activations for their ranges. By default both come from the
recipe's validation text (the prepared data's held-out shards, every source in turn, so the blend
the model was trained on is what it is calibrated on). Windows are taken from the *end* of each
stream, while validation loss (eval/validation.py) reads from the start: the ranges are not set on
the very tokens the loss is then scored on. `--calib FILE` (or the recipe's `calib:`) takes a JSONL
file with a `text` field per line or a plain text file, tokenized with the checkpoint's tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stagewise.data.errors import BadInput, read_utf8


def stream_batches(streams: dict[str, np.ndarray], n_batches: int, batch_size: int, seq_length: int) -> list[dict]:
    """`n_batches` of [batch_size, seq_length] windows, sources in turn, each stream read from its end."""
    windows: list[np.ndarray] = []
    cursors = {name: len(tokens) for name, tokens in streams.items()}
    names = sorted(n for n, t in streams.items() if len(t) >= seq_length)
    if not names:
        raise BadInput(f"calibration: no validation stream holds {seq_length} tokens (lower quantize.seq_length)")
    while len(windows) < n_batches * batch_size and names:
        for name in list(names):
            end = cursors[name]
            if end < seq_length:
                names.remove(name)
                continue
            windows.append(np.asarray(streams[name][end - seq_length:end], dtype=np.int64))
            cursors[name] = end - seq_length
            if len(windows) == n_batches * batch_size:
                break
    return _batches(windows, batch_size)


def _batches(windows: list[np.ndarray], batch_size: int) -> list[dict]:
    out = []
    for i in range(0, len(windows) - batch_size + 1, batch_size):
        ids = torch.from_numpy(np.stack(windows[i:i + batch_size]))
        out.append({"input_ids": ids, "labels": ids})
    if not out:
        raise BadInput(f"calibration: fewer than {batch_size} windows of text to calibrate on")
    return out


def read_texts(path: str | Path) -> list[str]:
    """The documents of a calibration file: JSONL with a string `text` per line, or plain text (one document)."""
    raw = read_utf8(path, "calibration file")
    if not str(path).endswith((".jsonl", ".json")):
        return [raw]
    texts = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise BadInput(f"{path}:{n}: text: each line must be an object with a string `text` field")
        texts.append(row["text"])
    if not texts:
        raise BadInput(f"{path}: no text to calibrate on")
    return texts


def text_batches(path: str | Path, tokenizer: Any, n_batches: int, batch_size: int, seq_length: int) -> list[dict]:
    """Calibration batches from a text file, tokenized with `tokenizer` and cut into windows."""
    ids = [i for t in read_texts(path) for i in tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]]
    stream = np.asarray(ids, dtype=np.int64)
    windows = [stream[s:s + seq_length] for s in range(0, len(stream) - seq_length + 1, seq_length)]
    if len(windows) < batch_size:
        raise BadInput(f"{path}: {len(stream)} tokens make fewer than {batch_size} windows of {seq_length}")
    return _batches(windows[: n_batches * batch_size], batch_size)
