"""The Hugging Face directory stagewise hands Megatron-Bridge: one whose config.json reads under the
transformers Megatron-Bridge pins, not only under ours.

Why: Megatron-Bridge 0.6.2 pins transformers >= 5.8, <= 5.12.1 while our checkpoints are written by
transformers 5.24, whose NemotronHConfig names the layer kinds in `layers_block_type` (and
`mtp_layers_block_type`) `linear_attention` / `full_attention`. Transformers 5.12 knows only `mamba` /
`attention` and refuses such a config outright (a class validation error on `layers_block_type`),
so Megatron-Bridge's HF import fails on the first checkpoint trained on CPU. Transformers 5.24 still
reads the old names (it remaps them while loading), so a config in the old names reads on both sides
of the version line: Megatron-Bridge imports it, and the export it writes against it as template
(5.12 writes the names it read) is read again by ours when engines/launch/stage.py adopts it.
Everything else in config.json is left as our transformers wrote it: 5.12 reads it as it is
(tests/engines/megatron/test_real_round_trip.py checks both directions through the released library).

Only config.json is rewritten; every other file of the checkpoint is an absolute symlink to the
original, so nothing large is copied (a container sees the workdir at the same path, see
engines/launch/stage.py). Directories (trainer state) are left out: the HF import does not read them.

The run's tokenizer is read by the same transformers, and AutoTokenizer.from_pretrained reads a
directory's config.json too: handed one of our checkpoints as `tokenizer.tokenizer_model`, the
training run would fail while building its tokenizer ("`layers_block_type` contains invalid types").
`megatron_tokenizer_dir` is the tokenizer's own files in the same form, without the weights
(tests/engines/megatron/test_real_plans.py builds the tokenizer of stage.py's SFT and long-context
plans as the release does, and shows the checkpoint directory itself refused).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from stagewise.model.checkpoint import META_FILE, _is_weights

LEGACY_LAYER_TYPES = {"linear_attention": "mamba", "full_attention": "attention"}
"""Our transformers' NemotronH layer kinds -> the names the transformers Megatron-Bridge pins accepts."""
LAYER_TYPE_KEYS = ("layers_block_type", "mtp_layers_block_type")


def pinned_transformers_config(doc: dict[str, Any]) -> dict[str, Any]:
    """A config.json document with its layer kinds in the names Megatron-Bridge's transformers reads."""
    out = dict(doc)
    for key in LAYER_TYPE_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [LEGACY_LAYER_TYPES.get(kind, kind) for kind in out[key]]
    return out


def write_pinned_config(hf_dir: str | os.PathLike) -> Path:
    """Rewrite `hf_dir/config.json` in place for Megatron-Bridge's transformers (for a directory that
    exists only to be handed to Megatron-Bridge, e.g. the export template of a pretraining run)."""
    path = Path(hf_dir) / "config.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(pinned_transformers_config(doc), indent=2, sort_keys=True) + "\n")
    return path


def megatron_hf_dir(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """`out`: the checkpoint as Megatron-Bridge's import and export read it (config.json rewritten,
    every other top-level file a symlink to the checkpoint's own). Made afresh on every call."""
    src = Path(checkpoint).resolve()
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: no config.json (not a Hugging Face checkpoint)")
    return _pinned_copy(src, Path(out), lambda name: True)


def megatron_tokenizer_dir(tokenizer: str | os.PathLike, out: str | os.PathLike) -> Path:
    """`out`: the tokenizer directory `tokenizer` (a checkpoint, or a tokenizer alone) as the run's
    tokenizer build reads it: its files symlinked, never weights or our metadata (the files
    model.checkpoint copies as a checkpoint's tokenizer), and config.json, where there is one,
    rewritten as megatron_hf_dir rewrites it. Made afresh on every call."""
    src = Path(tokenizer).resolve()
    if not (src / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"{src}: no tokenizer_config.json (not a Hugging Face tokenizer directory)")
    return _pinned_copy(src, Path(out), lambda name: not _is_weights(name) and name != META_FILE)


def _pinned_copy(src: Path, dst: Path, keep) -> Path:
    """`dst` made afresh: a symlink to every top-level file of `src` that `keep` accepts, but
    config.json, written with the pinned transformers' layer names (when `src` has one)."""
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    elif dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for item in sorted(src.iterdir()):
        if item.is_file() and item.name != "config.json" and keep(item.name):
            (dst / item.name).symlink_to(item)
    if (src / "config.json").is_file():
        doc = json.loads((src / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(pinned_transformers_config(doc), indent=2, sort_keys=True) + "\n")
    return dst
