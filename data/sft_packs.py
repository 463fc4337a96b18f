"""The SFT data path after curation: render -> pack -> rows on disk -> training batches.

    packed = pack_conversations(convs, tokenizer, PackingConfig(pack_size=1024), off_fraction=0.1, seed=0)
    save_packed(path, packed.rows)                     # .npz, loaded back with load_packed
    batches = PackedBatches(packed.rows, global_batch=8, seed=0)
    batch = batches.next_batch()   # {"input_ids", "labels", "position_ids", "seq_idx"}: [8, pack_size]
    Trainer(model, cfg, batches, SFTObjective("token"), ...)   # no engine change needed

The same functions back `stagewise data pack` and the SFT stage, so what the CLI reports
is what training gets. A conversation is one packed example, or several when its chat
template is not prefix-stable (data/chat_masks.py); the report counts conversations. Every batch tensor is [rows, pack_size], and the batch is a
PackedBatch: a dict that splits along dim 0 like a tensor, which is all the engine asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stagewise.data.chat import prompt_key, reasoning_enabled, render_examples
from stagewise.data.loader import DataExhausted
from stagewise.data.packing import PackReport, best_fit_decreasing, pack_rows, supervised_count
from stagewise.data.reasoning_switch import SwitchSetting, refuse_without_switch, resolve_switch
from stagewise.data.sft_config import PackingConfig

KEYS = ("input_ids", "labels", "position_ids", "seq_idx")


class PackedBatch(dict):
    """A dict of [rows, pack_size] tensors that also answers the three tensor calls the
    engine makes on a global batch (`.to`, `.split(micro_batch)`, `.device`), so
    model.trainer.Trainer splits it into micro-batches without knowing it is not a tensor."""

    def to(self, device, non_blocking: bool = False) -> "PackedBatch":
        return PackedBatch({k: v.to(device, non_blocking=non_blocking) for k, v in self.items()})

    def split(self, size: int) -> tuple["PackedBatch", ...]:
        parts = {k: v.split(size) for k, v in self.items()}
        return tuple(PackedBatch({k: parts[k][i] for k in parts}) for i in range(len(parts[KEYS[0]])))

    @property
    def device(self) -> torch.device:
        return self[KEYS[0]].device


@dataclass
class PackedData:
    """Packed rows, where every example went, whose conversation each example is, and how many
    conversations trained without reasoning."""

    rows: dict[str, np.ndarray]
    report: PackReport
    reasoning_off: int
    owners: list[int]
    """Example i is of conversation owners[i] (one example per conversation unless the template is
    not prefix-stable: data/chat_masks.py)."""

    def to_dict(self) -> dict[str, Any]:
        packed = {self.owners[i] for p in self.report.packs for i in p}
        return {**self.report.to_dict(), "conversations": len(packed), "reasoning_off": self.reasoning_off}


@dataclass
class Encoded:
    """Every conversation's training examples ((input_ids, assistant_mask) each), in order."""

    examples: list[tuple[list[int], list[int]]]
    owners: list[int]
    """The index of the conversation each example is of."""
    reasoning_off: int
    """Conversations rendered with reasoning off."""


def encode(convs: Sequence[dict], tokenizer: Any, off_fraction: float = 0.0, seed: int = 0,
           switch: SwitchSetting = "auto") -> Encoded:
    """Render every conversation into its examples, a seeded `off_fraction` of them with reasoning
    off by the model's own switch (`switch`: the recipe's tokenizer.reasoning_switch); BadInput
    naming that field when the fraction is above 0 and the template has no switch."""
    resolved = resolve_switch(tokenizer, switch)
    refuse_without_switch(resolved, {"reasoning_off_fraction": off_fraction}, "the tokenizer SFT packs with")
    out = Encoded([], [], 0)
    for n, conv in enumerate(convs):
        on = reasoning_enabled(conv, off_fraction, seed)
        out.reasoning_off += not on
        examples = render_examples(conv, tokenizer, reasoning=on, switch=resolved)
        out.examples += examples
        out.owners += [n] * len(examples)
    return out


def pack_conversations(convs: Sequence[dict], tokenizer: Any, cfg: PackingConfig, off_fraction: float = 0.0,
                       seed: int = 0, switch: SwitchSetting = "auto") -> PackedData:
    """Render and best-fit-decreasing pack `convs` into rows of cfg.pack_size tokens. The examples
    of one conversation share its prompt key, so with distinct_prompts no two share a pack."""
    enc = encode(convs, tokenizer, off_fraction, seed, switch)
    keys = [prompt_key(convs[n]) for n in enc.owners] if cfg.distinct_prompts else None
    report = best_fit_decreasing([len(ids) for ids, _ in enc.examples], cfg.pack_size, keys,
                                 [supervised_count(mask) for _, mask in enc.examples])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return PackedData(pack_rows(enc.examples, report, pad), report, enc.reasoning_off, enc.owners)


def save_packed(path: str | Path, rows: dict[str, np.ndarray]) -> Path:
    """Write the rows as one .npz (uncompressed: loading is a memcpy)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, **rows)
    return path


def load_packed(path: str | Path) -> dict[str, np.ndarray]:
    """The rows written by save_packed."""
    with np.load(path) as z:
        return {k: z[k] for k in KEYS}


class PackedBatches:
    """The trainer's batch source over packed rows: seeded shuffles, one epoch after another.

    next_batch() -> PackedBatch of LongTensor (seq_idx int32) [global_batch, pack_size]; raises
    DataExhausted when `max_epochs` passes are done. state_dict()/load_state_dict() resume
    exactly (the permutation of epoch e depends only on (seed, e))."""

    def __init__(self, rows: dict[str, np.ndarray], global_batch: int, seed: int = 0,
                 max_epochs: float | None = None) -> None:
        self.rows, self.global_batch, self.seed, self.max_epochs = rows, global_batch, seed, max_epochs
        self.n = len(rows["input_ids"])
        if self.n < global_batch:
            raise ValueError(f"only {self.n} packs for a global batch of {global_batch}")
        self.epoch, self.pos = 0, 0

    def _perm(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def next_batch(self) -> PackedBatch:
        if self.pos + self.global_batch > self.n:  # drop the ragged tail of an epoch
            self.epoch, self.pos = self.epoch + 1, 0
        if self.max_epochs is not None and self.epoch + self.pos / self.n >= self.max_epochs:
            raise DataExhausted(f"packed SFT data used for {self.max_epochs} epochs")
        idx = self._perm(self.epoch)[self.pos:self.pos + self.global_batch]
        self.pos += self.global_batch
        return PackedBatch({k: torch.from_numpy(self.rows[k][idx]) for k in KEYS})

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "n": self.n}

    def load_state_dict(self, state: dict) -> None:
        if state.get("n") != self.n or state.get("seed") != self.seed:
            raise ValueError(f"cannot resume: state for {state.get('n')} packs / seed {state.get('seed')}, "
                             f"this source has {self.n} / {self.seed}")
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
