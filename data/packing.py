"""Best-fit-decreasing packing of whole conversations into fixed-size rows (ALGORITHMS.md section 4).

Why best fit decreasing: placing long conversations first and each one where it leaves the
least room wastes almost nothing on a realistic mix (benchmarks/packing.py), and a
conversation is never split or truncated, so no sample is trained on without its prompt.

    report = best_fit_decreasing(lengths, pack_size, keys)      # which items go where
    rows = [pack_row(docs, pack_size, pad_id) for docs in ...]  # the tensors of one pack

The rule, exactly: sort longest first (ties keep input order); put each item into the
open pack with the least room that still fits it (ties: the lowest pack index); if that
pack already holds the item's prompt key, try the next best, and so on; else open a new
pack. An item longer than a pack is dropped and counted. Open packs live in a sorted list
of (room, index), so each placement is a bisect, not a scan over every pack.

Inside a pack (`pack_row`): labels[t] = input_ids[t+1] where that token is supervised and
in the same conversation, else -100 (so each conversation's last position has no label
and no label crosses a boundary); position_ids restart at 0 per conversation; seq_idx
numbers the conversations 0, 1, ... The tail is padding: pad ids, label -100, its own
seq_idx and positions from 0, so it is a separate (ignored) segment.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IGNORE = -100


@dataclass
class PackReport:
    """Where every item went, and how well the packs are filled."""

    packs: list[list[int]]
    """Item indices per pack, in placement order (longest first)."""
    efficiency: float
    """Sum of packed lengths / (packs x pack size)."""
    dropped: int
    """Items longer than a pack (never split)."""
    supervised_tokens: int
    """Labels that are not -100 over every pack (0 when no masks were given)."""
    pack_size: int
    dropped_items: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Counts only (the item lists can be huge)."""
        return {"packs": len(self.packs), "efficiency": round(self.efficiency, 6), "dropped": self.dropped,
                "supervised_tokens": self.supervised_tokens, "pack_size": self.pack_size}


def best_fit_decreasing(lengths: Sequence[int], pack_size: int, keys: Sequence[Any] | None = None,
                        supervised: Sequence[int] | None = None) -> PackReport:
    """Pack items of `lengths` (see the module docstring). `keys[i]`: item i's prompt key (no two
    equal keys share a pack); `supervised[i]`: item i's label count, summed into the report."""
    if pack_size <= 0:
        raise ValueError(f"pack_size must be > 0, got {pack_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep input order
    open_packs: list[tuple[int, int]] = []  # (room left, pack index), sorted
    packs: list[list[int]] = []
    pack_keys: list[set] = []
    dropped: list[int] = []
    for i in order:
        length = int(lengths[i])
        if length > pack_size or length <= 0:
            dropped.append(i)
            continue
        key = keys[i] if keys is not None else None
        pos = bisect.bisect_left(open_packs, (length, -1))
        while pos < len(open_packs) and key is not None and key in pack_keys[open_packs[pos][1]]:
            pos += 1  # the best fit holds this prompt already: try the next best
        if pos < len(open_packs):
            room, p = open_packs.pop(pos)
        else:
            room, p = pack_size, len(packs)
            packs.append([])
            pack_keys.append(set())
        packs[p].append(i)
        if key is not None:
            pack_keys[p].add(key)
        if room - length > 0:
            bisect.insort(open_packs, (room - length, p))
    used = sum(int(lengths[i]) for pack in packs for i in pack)
    sup = sum(int(supervised[i]) for pack in packs for i in pack) if supervised is not None else 0
    eff = used / (len(packs) * pack_size) if packs else 0.0
    return PackReport(packs, eff, len(dropped), sup, pack_size, sorted(dropped))


def doc_labels(input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """labels[t] = input_ids[t+1] where mask[t+1], else -100; the last position is always -100."""
    labels = np.full(len(input_ids), IGNORE, dtype=np.int64)
    labels[:-1] = np.where(np.asarray(mask[1:], dtype=bool), input_ids[1:], IGNORE)
    return labels


def supervised_count(mask: Sequence[int]) -> int:
    """Labels a conversation contributes (its first token is never a target)."""
    return int(np.count_nonzero(np.asarray(mask[1:])))


def pack_row(docs: Sequence[tuple[Sequence[int], Sequence[int]]], pack_size: int, pad_id: int) -> dict[str, np.ndarray]:
    """One pack's arrays from (input_ids, assistant_mask) pairs: input_ids, labels, position_ids
    (int64) and seq_idx (int32), each of length pack_size."""
    ids = np.full(pack_size, pad_id, dtype=np.int64)
    labels = np.full(pack_size, IGNORE, dtype=np.int64)
    pos = np.zeros(pack_size, dtype=np.int64)
    seq = np.zeros(pack_size, dtype=np.int32)
    t = 0
    for d, (doc_ids, mask) in enumerate(docs):
        doc_ids = np.asarray(doc_ids, dtype=np.int64)
        n = len(doc_ids)
        if t + n > pack_size:
            raise ValueError(f"documents overflow the pack: {t + n} > {pack_size}")
        ids[t:t + n] = doc_ids
        labels[t:t + n] = doc_labels(doc_ids, np.asarray(mask))
        pos[t:t + n] = np.arange(n)
        seq[t:t + n] = d
        t += n
    pos[t:] = np.arange(pack_size - t)  # padding: one more segment, positions from 0
    seq[t:] = len(docs)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "seq_idx": seq}


def pack_rows(encoded: Sequence[tuple[Sequence[int], Sequence[int]]], report: PackReport,
              pad_id: int) -> dict[str, np.ndarray]:
    """Every pack of `report` as stacked arrays [n_packs, pack_size]."""
    rows = [pack_row([encoded[i] for i in pack], report.pack_size, pad_id) for pack in report.packs]
    if not rows:
        empty = {k: np.zeros((0, report.pack_size), dtype=np.int64) for k in ("input_ids", "labels", "position_ids")}
        return {**empty, "seq_idx": np.zeros((0, report.pack_size), dtype=np.int32)}
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
