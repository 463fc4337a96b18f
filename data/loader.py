"""Pretraining batches: phased blends over token shards, epoch caps and exact resume.

Each step yields a [global_batch, seq_length + 1] LongTensor (inputs = [:, :-1], labels =
[:, 1:]). A step counts global_batch × seq_length tokens (`tokens_per_step`), which is how
phases, `realized()` and the trainer's tokens_seen are measured.

Rules (ALGORITHMS.md §3; the exact allocation is ours):
- Phase of step s: the first phase with s · tokens_per_step < until · total_tokens.
- Rows per source: the phase's weights, normalised over the sources still active, are
  apportioned to the B rows of a step with a carried remainder: q_i = d_i + w_i·B,
  n_i = ⌊q_i⌋, rows still free go to the largest q_i − n_i (ties: name order), and the
  remainder d_i = q_i − n_i carries to the next step. So each source's realised row count
  stays within one row of w_i × rows-so-far at every step of a phase. The carry resets
  when the weights change (a new phase, or a source retired). The rows are then shuffled
  with a generator seeded by (seed, step). Everything depends only on (seed, step) and the
  state, so resume is exact.
- A row takes the next seq_length + 1 tokens of the source's train shard from its cursor
  (wrapping to the start = one more epoch; rows do not overlap).
- Epoch cap: a source may consume at most ⌊max_epochs × train_tokens⌋ tokens. When a
  step's allocation asks a source for more rows than it has left, it gives the rows it has,
  is retired for the rest of the run (one warning), the rest of the step is re-apportioned
  over the renormalised remaining weights, and when a phase has no source left,
  `DataExhausted` is raised.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from stagewise.data.config import PhaseConfig, check_phases
from stagewise.data.shards import TokenShard

STATE_VERSION = 1
log = logging.getLogger(__name__)


class DataExhausted(RuntimeError):
    """Every source of the current phase has reached its epoch cap."""


@dataclass
class _Source:
    shard: TokenShard
    cap: int
    cursor: int = 0
    consumed: int = 0


def apportion(weights: dict[str, float], rows: int, carry: dict[str, float]) -> tuple[dict[str, int], dict[str, float]]:
    """Rows per source for one step and the carried remainders (see the module docstring)."""
    names = sorted(weights)
    q = {s: carry.get(s, 0.0) + weights[s] * rows for s in names}
    n = {s: max(0, math.floor(q[s])) for s in names}
    while sum(n.values()) > rows:  # a negative carry was clipped at 0: take back from the most served
        s = min((s for s in names if n[s] > 0), key=lambda s: q[s] - n[s])
        n[s] -= 1
    while sum(n.values()) < rows:
        s = max(names, key=lambda s: q[s] - n[s])
        n[s] += 1
    return n, {s: q[s] - n[s] for s in names}


class PretrainBatches:
    """Deterministic, resumable pretraining batches over a PreparedData (see the module docstring)."""

    def __init__(self, prepared, phases: list[PhaseConfig], max_epochs: dict[str, float], seq_length: int,
                 global_batch: int, total_tokens: int, seed: int, on_warning: Callable[[str], None] | None = None):
        check_phases(phases, list(prepared.sources))
        if seq_length <= 0 or global_batch <= 0 or total_tokens <= 0:
            raise ValueError("seq_length, global_batch and total_tokens must be > 0")
        used = sorted({s for p in phases for s, w in p.blend.items() if w > 0})
        missing = [s for s in used if s not in max_epochs]
        if missing:
            raise ValueError(f"max_epochs has no entry for sources {missing}")
        self.prepared, self.phases, self.seed = prepared, list(phases), seed
        self.seq_length, self.global_batch, self.total_tokens = seq_length, global_batch, total_tokens
        self.tokens_per_step = global_batch * seq_length
        self.on_warning = on_warning or log.warning
        self.sources = {s: self._open(s, max_epochs[s]) for s in used}
        self.step = 0
        self.retired: list[str] = []
        self.carry: dict[str, float] = {}
        self.carry_key = ""
        self._realized = {p.name: {} for p in self.phases}

    def _open(self, name: str, epochs: float) -> _Source:
        shard = TokenShard.open(self.prepared.sources[name].train)
        return _Source(shard, math.floor(min(epochs * shard.n_tokens, 2**62)))

    def phase_at(self, step: int) -> PhaseConfig:
        """The first phase with step · tokens_per_step < until · total_tokens (the last one after the end)."""
        for phase in self.phases:
            if step * self.tokens_per_step < phase.until * self.total_tokens:
                return phase
        return self.phases[-1]

    def weights(self, phase: PhaseConfig) -> dict[str, float]:
        """The phase's blend over the active sources, normalised to sum to 1."""
        active = {s: w for s, w in phase.blend.items() if w > 0 and s not in self.retired}
        total = sum(active.values())
        return {s: w / total for s, w in sorted(active.items())}

    def rows_left(self, name: str) -> int:
        src = self.sources[name]
        return (src.cap - src.consumed) // (self.seq_length + 1)

    def next_batch(self) -> torch.Tensor:
        """The next [global_batch, seq_length + 1] batch; raises DataExhausted when the phase has no source left."""
        phase = self.phase_at(self.step)
        plan = self._plan(self.step, phase)
        out = np.empty((self.global_batch, self.seq_length + 1), dtype=np.int64)
        realized = self._realized[phase.name]
        for row, name in enumerate(plan):
            out[row] = self._take(self.sources[name])
            realized[name] = realized.get(name, 0) + self.seq_length
        self.step += 1
        return torch.from_numpy(out)

    def _plan(self, step: int, phase: PhaseConfig) -> list[str]:
        """The source of every row of this step (apportioned, capped, then shuffled)."""
        fixed: dict[str, int] = {}
        while True:
            weights = self.weights(phase)
            if not weights:
                raise DataExhausted(
                    f"step {step}: every source of phase {phase.name!r} ({', '.join(sorted(phase.blend))}) "
                    f"has reached its epoch cap; lower total_tokens or raise max_epochs")
            key = f"{phase.name}|{','.join(weights)}"
            counts, carry = apportion(weights, self.global_batch - sum(fixed.values()),
                                      self.carry if key == self.carry_key else {})
            over = [s for s in counts if counts[s] > self.rows_left(s)]
            if not over:
                break
            for name in over:
                fixed[name] = self.rows_left(name)
                self._retire(name, step, phase)
        self.carry, self.carry_key = carry, key
        rows = [s for s, n in sorted({**counts, **fixed}.items()) for _ in range(n)]
        order = np.random.default_rng([self.seed % 2**63, step]).permutation(len(rows))
        return [rows[i] for i in order]

    def _retire(self, name: str, step: int, phase: PhaseConfig) -> None:
        self.retired.append(name)
        src = self.sources[name]
        left = self.weights(phase)
        self.on_warning(
            f"data: source {name!r} reached its epoch cap ({src.cap:,} tokens = max_epochs × "
            f"{src.shard.n_tokens:,} train tokens) at step {step}; retired for the rest of the run; "
            f"phase {phase.name!r} weights renormalised to "
            + (", ".join(f"{s}={w:.3f}" for s, w in left.items()) or "nothing (no source left)"))

    def _take(self, src: _Source) -> np.ndarray:
        """The next seq_length + 1 tokens from the source's cursor, wrapping at the end."""
        n, width, start = src.shard.n_tokens, self.seq_length + 1, src.cursor
        if start + width <= n:
            row = src.shard.tokens[start: start + width]
        else:
            row = np.take(src.shard.tokens, np.arange(start, start + width) % n)
        src.cursor = (start + width) % n
        src.consumed += width
        return row

    def realized(self) -> dict[str, dict[str, int]]:
        """Tokens (seq_length per row) served so far, per phase and source."""
        return {p: dict(sorted(d.items())) for p, d in self._realized.items()}

    def state_dict(self) -> dict:
        """JSON-able position: step, cursors, retirements, the carried remainders and realised counts."""
        return {
            "version": STATE_VERSION, "step": self.step, "seed": self.seed, "seq_length": self.seq_length,
            "global_batch": self.global_batch, "digest": self.prepared.digest,
            "sources": {s: {"cursor": src.cursor, "consumed": src.consumed} for s, src in self.sources.items()},
            "retired": list(self.retired), "carry": dict(self.carry), "carry_key": self.carry_key,
            "realized": self.realized(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state_dict()` was taken (same data, seed, seq_length and batch)."""
        expected = {"version": STATE_VERSION, "seed": self.seed, "seq_length": self.seq_length,
                    "global_batch": self.global_batch, "digest": self.prepared.digest}
        for field, mine in expected.items():
            if state.get(field) != mine:
                raise ValueError(f"cannot resume: loader state has {field}={state.get(field)!r}, this loader {mine!r}")
        unknown = sorted(set(state["sources"]) - set(self.sources))
        if unknown:
            raise ValueError(f"cannot resume: state names sources {unknown} this loader does not read")
        self.step = int(state["step"])
        for name, pos in state["sources"].items():
            self.sources[name].cursor, self.sources[name].consumed = int(pos["cursor"]), int(pos["consumed"])
        self.retired = list(state["retired"])
        self.carry, self.carry_key = {k: float(v) for k, v in state["carry"].items()}, state["carry_key"]
        self._realized = {p.name: dict(state["realized"].get(p.name, {})) for p in self.phases}


def validation_rows(prepared, seq_length: int, max_tokens: int, sources: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Held-out rows per source: [n, seq_length + 1] LongTensors cut from the start of each val shard.

    The budget of max_tokens (counted as seq_length per row, like training tokens) is split
    evenly over the sources, at least one row each; a val shard shorter than one row is left out.
    The rows are the same on every call, so validation losses are comparable across a run.
    """
    names = sorted(sources if sources is not None else prepared.sources)
    per_source = max(1, max_tokens // (max(1, len(names)) * seq_length))
    out = {}
    for name in names:
        tokens = TokenShard.open(prepared.sources[name].val).tokens
        n = min(per_source, len(tokens) // (seq_length + 1))
        if n > 0:
            rows = np.asarray(tokens[: n * (seq_length + 1)], dtype=np.int64).reshape(n, seq_length + 1)
            out[name] = torch.from_numpy(rows)
    return out
