"""RL batches: every optimizer step's rollouts, rewards and advantages, as the engine's batch source.

    batches = RolloutBatches(policy, generator, prompts, sampler, score, settings, seed, pad_id)
    Trainer(policy, train_cfg, batches, GRPOObjective(cfg), ...)   # model/trainer.py, unchanged loop

One step s: the sampler picks the step's prompts (curriculum, fixed domain ratios), the
generator samples `group_size` responses per prompt, `score` turns them into rewards, groups
whose rewards all agree are dropped (dynamic sampling: they carry no gradient), and the rest
become one RolloutBatch with leave-one-out advantages (model/objectives/grpo.py). When fewer
than `min_groups` groups have any signal, more prompts are drawn (`max_refills` times); a step
whose every draw lacks signal trains on its last draw with zero advantages (`rl/empty_step`).

**One-step off-policy** (`off_policy: true`): when step s's batch is handed to the trainer,
step s+1's rollouts start in a background thread from a copy of the weights *before* step s
trains, so sampling overlaps training and the batch a step trains on is at most one update
old. The staleness is corrected by the objective's masked importance weight π_θ/π_rollout
(detached; tokens outside [is_low, is_high] masked), or, with `recompute_old_logprobs`, by the
ratio ρ = π_θ/π_old against trainer-style log-probabilities under the sampling weights
(clipped), leaving the IS weight only the sampler-vs-trainer numerics. In the synchronous mode
a step's rollouts come from its own starting weights.

**π_old when a rollout batch is split** (`minibatches: k > 1`, k optimizer steps per batch):
the objective's IS weight is w = exp(old − rollout) and its ratio ρ = exp(logp − old), so what
`old_logprobs` holds decides what each corrects.
  - Synchronous: when the batch is drawn, the policy holds exactly the weights that sampled it.
    The first part needs no `old_logprobs`: its own training forward runs before its update, so
    the objective's `old = logp.detach()` is π_old at the sampling weights, scored by the trainer.
    The later parts (2..k) get theirs from a no-grad trainer forward (grpo.token_logprobs on the
    policy, times the response mask) over each one's rows, when the batch is split, before any of
    its updates: the cost is a no-grad forward over (k−1)/k of the batch's rows (at the policy's
    own precision, outside the trainer's autocast: on a GPU with bf16 autocast that is the one
    difference from the trainer's own forward). So w
    compares the sampler's log-probs with the trainer's at the same weights (the numerics:
    `sampler_precision: bf16`, or vLLM's kernels) and ρ carries the staleness the earlier parts'
    updates gave the later ones, clipped.
  - Off-policy with `recompute_old_logprobs`: π_old is the generator's trainer-style forward under
    the sampling weights, as above for every part.
  - Off-policy without it: every part's `old_logprobs` is the sampler's own log-probs, so ρ is
    clipped against the sampling policy but w = 1 exactly and masked IS masks nothing (the recipe
    doctor warns: rule `masked-is-inert`).
Without a split (k = 1) nothing is added: synchronous w is the numerics alone, off-policy w the
staleness and the numerics together (or the numerics alone with `recompute_old_logprobs`).

Everything a batch depends on is a function of (weights it was sampled with, step, seed):
prompts come from `sampler.sample(step, attempt)`, tokens from a generator seeded per step.
The pending off-policy batch and the parts of a split batch not yet trained (with the
`old_logprobs` computed when it was split) are part of `state_dict()` (tensors as base64
safetensors), so a resumed run trains the very batches an uninterrupted one would
(tests/model/test_rl_batches.py, test_resume_gives_the_same_weights).

With a `plateau` rule and a `reprofile` callback, a stalled training reward triggers a new
difficulty profile with the current policy (between two rollouts, while the generator is idle);
the sampler's pass rates are part of the saved state, so a resume keeps them.

With a `reference` (log-probs of a frozen model, the stage's start), every batch carries
`ref_logprobs` for the objective's k3 KL term.

This module knows nothing of verifiers or curricula: `score` and the sampler are handed in
(the RL stage wires eval/environments and data/rl_curriculum), so model/ stays torch-only.
"""

from __future__ import annotations

import base64
import hashlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol

import torch
from pydantic import Field, model_validator
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from stagewise.config_base import StrictConfig
from stagewise.model.objectives.grpo import RolloutBatch, leave_one_out, token_logprobs
from stagewise.model.rollout import Generator, Rollout


@dataclass(frozen=True)
class Prompt:
    """One RL prompt, tokenised (chat template applied, generation prompt added)."""

    id: str
    domain: str
    ids: tuple[int, ...]


Score = Callable[[Prompt, list[Rollout]], dict[str, list[float]]]
"""(prompt, its group of rollouts) -> reward components, each a list over the group; must hold
"total" (what the advantage is computed from) and "accuracy" (the verifier's 0/1)."""


class Sampler(Protocol):
    """Which prompts a step trains on (a curriculum); deterministic in (step, attempt)."""

    def sample(self, step: int, attempt: int) -> list[str]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SamplingSettings(StrictConfig):
    """How each step's responses are sampled (what RL and distillation share)."""

    group_size: int = Field(1, ge=1)
    """Responses sampled per prompt."""
    max_new_tokens: int = Field(16, gt=0)
    """Longest response; longer ones are cut (and usually score 0)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the trainer's log-probabilities use the same one."""
    off_policy: bool = True
    """One-step off-policy rollouts (step s+1 sampled while step s trains); false: synchronous.
    Synchronous, a rollout batch split into minibatches gets π_old from the trainer at the
    sampling weights (a no-grad forward over the later parts' rows), so masked IS corrects the
    sampler's numerics and ρ the later parts' staleness (module docstring)."""
    recompute_old_logprobs: bool = False
    """Off-policy only: recompute π_old with a trainer-style forward under the weights that
    sampled. The ratio ρ = π_θ/π_old then carries the one-step staleness (and is clipped) and
    the masked IS weight only the sampler-vs-trainer numerics. Off: no π_old, so ρ = 1 and the
    IS weight π_θ/π_rollout (detached, masked outside its band) carries both; with minibatches
    > 1 every part's π_old is the sampler's own log-probs, so w = 1 and masked IS is inert (the
    recipe doctor's `masked-is-inert`). Worth the extra forward when the sampler's numerics differ
    from the trainer's (vLLM, `sampler_precision: bf16`); the HF backends' log-probs at the
    trainer's precision match the trainer's to ~1e-4 and the forward costs ~40% of a rollout on a CPU."""
    sampler_precision: Literal["trainer", "bf16"] = "trainer"
    """The precision the hf / hf-process rollout backends sample in. trainer: a copy of the policy
    as the trainer holds it (fp32 on a CPU), log-probs equal to the trainer's up to ~1e-4. bf16:
    a bfloat16 copy, as a vLLM sampler on a GPU runs bf16 while the trainer keeps fp32: the
    sampler's log-probs then differ from the trainer's by bf16's rounding, and the masked IS
    weight w = π_trainer/π_sampler is what corrects it (tokens outside [is_low, is_high] get no
    gradient). Log-probs still come back as float32; the generator's trainer-style forward
    (`recompute_old_logprobs`) stays at the trainer's precision. The generator also scores the
    difficulty profile and held-out pass@1, so those are sampled in bf16 too."""

    @model_validator(mode="after")
    def _recompute_needs_off_policy(self) -> "SamplingSettings":
        if self.recompute_old_logprobs and not self.off_policy:
            raise ValueError("recompute_old_logprobs only applies to off_policy rollouts (synchronous ones are not stale)")
        return self

    def optimizer_steps(self) -> int:
        """Optimizer steps each batch of samples is trained as: one (RL's rollouts may be split)."""
        return 1


class RolloutSettings(SamplingSettings):
    """How each GRPO step's rollouts are drawn: sampling, plus what a group's rewards decide."""

    group_size: int = Field(8, ge=2)
    """G: responses sampled per prompt (the leave-one-out baseline needs at least 2)."""
    scale_by_std: bool = False
    """Divide advantages by the group's reward std (Dr. GRPO leaves it off)."""
    min_groups: int = Field(1, ge=1)
    """Draw more prompts when fewer groups than this have any reward variance."""
    max_refills: int = Field(2, ge=0)
    """How many extra draws a step may make to reach min_groups."""
    minibatches: int = Field(1, ge=1)
    """Optimizer steps per rollout batch: its rows are split into this many parts (shortest rows
    first, padding cut), each one update (PPO-style reuse of the rollouts). The later parts are
    off-policy by the earlier updates, so ρ = π_θ/π_old against the sampling weights is clipped.
    π_old: synchronous, the trainer's log-probs at the sampling weights (the first part's own
    forward; a no-grad forward over the later parts' rows when the batch is split); off-policy,
    the generator's trainer-style forward with `recompute_old_logprobs`, else the sampler's own
    log-probs (then w = 1: masked IS is inert)."""

    @model_validator(mode="after")
    def _parts_fit_a_group(self) -> "RolloutSettings":
        if self.minibatches > self.group_size:
            raise ValueError(f"minibatches ({self.minibatches}) must be <= group_size ({self.group_size}): "
                             "a batch may keep a single group, and every part needs a row")
        return self

    def optimizer_steps(self) -> int:
        """Optimizer steps each rollout batch is trained as: its `minibatches` parts."""
        return self.minibatches


class PlateauRule(StrictConfig):
    """When the training reward has stalled: the mean accuracy reward of the last `window` steps
    beats the `window` before them by no more than `min_gain` (checked at most once per 2 windows)."""

    window: int = Field(10, gt=0)
    """Steps per window."""
    min_gain: float = Field(0.01, ge=0)
    """Smallest rise of the windowed mean accuracy reward that still counts as progress."""

    def stalled(self, history: list[float], since: int) -> bool:
        """Whether `history` (one value per step) has stalled, looking only at steps after `since`."""
        w = self.window
        if len(history) - since < 2 * w:
            return False
        recent, before = history[-w:], history[-2 * w:-w]
        return sum(recent) / w - sum(before) / w <= self.min_gain


def seed_for(seed: int, *parts: object) -> int:
    """A 63-bit seed for one draw (step, attempt...), independent of any RNG's position."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of the weights, safe to read while the trainer updates the originals."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class RolloutBatches:
    """The engine's batch source for GRPO (see the module docstring)."""

    def __init__(self, policy: torch.nn.Module, generator: Generator, prompts: dict[str, Prompt], sampler: Sampler,
                 score: Score, settings: SamplingSettings, seed: int, pad_id: int,
                 reprofile: Callable[[int], None] | None = None, plateau: PlateauRule | None = None,
                 reference: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.policy, self.generator, self.prompts = policy, generator, prompts
        self.sampler, self.score, self.settings = sampler, score, settings
        self.seed, self.pad_id = seed, pad_id
        self.reprofile, self.plateau = reprofile, plateau
        self.reference = reference  # input_ids -> log π_ref(target) [n, L-1], for the KL term
        self.step = 0  # optimizer steps
        self.rollout = 0  # rollout batches drawn (= step with one minibatch per batch)
        self._queue: list[RolloutBatch] = []  # the current rollout batch's parts not yet trained
        self.trained_tokens = 0
        self.accuracy: list[float] = []  # the training reward per step, for the plateau rule
        self.reprofiled_at = 0
        self._pending: Future | None = None
        self._restored: RolloutBatch | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollouts") if settings.off_policy else None

    # ------------------------------------------------------------------ the engine's calls

    def next_batch(self) -> RolloutBatch:
        step = self.step + 1
        if not self._queue:  # a new rollout batch (every step unless minibatches > 1)
            self._queue = self._rollout_parts(self.rollout + 1)
        batch = self._queue.pop(0)
        if self.settings.off_policy and not self._queue:
            # the next rollouts, from the weights this step starts from, while it trains
            self._pending = self._pool.submit(self._collect_with, snapshot(self.policy), self.rollout + 1)
        self.step = step
        self.trained_tokens += int(batch["response_mask"].sum())
        return batch

    def _rollout_parts(self, rollout: int) -> list[RolloutBatch]:
        """Rollout batch number `rollout` (its seed and prompts are the rollout's, so with one part
        per batch rollout r is step r), split into `minibatches` parts that carry its metrics."""
        if not self.settings.off_policy:
            reprofiled = self._maybe_reprofile(rollout)
            self.generator.sync_weights(self.policy.state_dict())
            batch = self._collect(rollout, with_old=False)
        else:
            batch = self._take(rollout)
            reprofiled = self._maybe_reprofile(rollout)  # the generator is idle here
        self.rollout = rollout
        self.accuracy.append(float(batch.metrics.get("rl/reward/accuracy", 0.0)))
        if self.reprofile is not None:
            batch.metrics["rl/reprofiled"] = float(reprofiled)
        k = self.settings.optimizer_steps()
        if k == 1:
            return [batch]
        synchronous = not self.settings.off_policy
        if "old_logprobs" not in batch and not synchronous:
            # off-policy without recompute_old_logprobs: ρ against the sampler's log-probs, w = 1 (inert)
            batch["old_logprobs"] = batch["rollout_logprobs"].clone()
        parts = batch.parts(k)
        for part in parts:
            part.metrics = dict(batch.metrics)
        if synchronous:  # the policy holds the sampling weights now, before any of this batch's updates
            for part in parts[1:]:  # the first part's own forward is π_old: it carries none
                part["old_logprobs"] = self._trainer_logprobs(part)
        return parts

    @torch.no_grad()
    def _trainer_logprobs(self, part: RolloutBatch) -> torch.Tensor:
        """The trainer's log π(target) of a part's rows under the policy's current weights (one
        no-grad forward, as the objective computes them), zero outside the response."""
        device = next(self.policy.parameters()).device
        mask = part["response_mask"]
        logp, _ = token_logprobs(self.policy, part["input_ids"].to(device), self.settings.temperature,
                                 mask=mask.to(device))
        return logp.cpu() * mask

    def _maybe_reprofile(self, step: int) -> bool:
        """On a plateau, re-profile the prompts with the current policy (the caller's `reprofile`
        updates the sampler's pass rates); the curriculum then weighs what is hard *now*."""
        if self.reprofile is None or self.plateau is None or not self.plateau.stalled(self.accuracy, self.reprofiled_at):
            return False
        self.reprofile(step)
        self.reprofiled_at = len(self.accuracy)
        return True

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"step": self.step, "rollout": self.rollout, "trained_tokens": self.trained_tokens,
                                 "sampler": self.sampler.state_dict(), "accuracy": list(self.accuracy),
                                 "reprofiled_at": self.reprofiled_at}
        pending = self._restored if self._restored is not None else (
            self._pending.result() if self._pending is not None else None)
        state["pending"] = encode_batch(pending) if pending is not None else None
        state["queue"] = [encode_batch(b) for b in self._queue]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.trained_tokens = int(state["step"]), int(state.get("trained_tokens", 0))
        self.rollout = int(state.get("rollout", self.step))
        self.sampler.load_state_dict(state["sampler"])
        self.accuracy = [float(a) for a in state.get("accuracy", [])]
        self.reprofiled_at = int(state.get("reprofiled_at", 0))
        self._pending = None
        self._restored = decode_batch(state["pending"]) if state.get("pending") else None
        self._queue = [decode_batch(b) for b in state.get("queue", [])]

    def close(self) -> None:
        """Wait for a rollout in flight and stop the background thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------ rollouts

    def _take(self, step: int) -> RolloutBatch:
        if self._restored is not None:
            batch, self._restored = self._restored, None
            return batch
        if self._pending is not None:
            pending, self._pending = self._pending, None
            return pending.result()
        # the first step (or a resume without a pending batch): sampled now, from the current weights
        return self._collect_with(snapshot(self.policy), step)

    def _collect_with(self, weights: dict[str, torch.Tensor], step: int) -> RolloutBatch:
        self.generator.sync_weights(weights)
        return self._collect(step, with_old=True)

    def _collect(self, step: int, with_old: bool) -> RolloutBatch:
        s = self.settings
        started = time.perf_counter()
        groups: list[tuple[Prompt, list[Rollout], dict[str, list[float]]]] = []
        kept: list[tuple[Prompt, list[Rollout], dict[str, list[float]]]] = []
        for attempt in range(s.max_refills + 1):
            chosen = [self.prompts[i] for i in self.sampler.sample(step, attempt)]
            sampled = self.generator.generate([list(p.ids) for p in chosen], s.group_size, s.max_new_tokens,
                                              s.temperature, seed_for(self.seed, "rollout", step, attempt))
            for prompt, group in zip(chosen, sampled):
                rewards = self.score(prompt, group)
                groups.append((prompt, group, rewards))
                if max(rewards["total"]) > min(rewards["total"]):
                    kept.append((prompt, group, rewards))
            if len(kept) >= s.min_groups:
                break
        rollout_s = time.perf_counter() - started
        empty = not kept
        if empty:  # no draw had any signal: the step trains on the last draw with zero advantages
            kept = groups[-len(chosen):]
        batch = self._tensors(kept)
        if with_old and s.recompute_old_logprobs and len(batch["input_ids"]):  # under the weights that sampled
            batch["old_logprobs"] = self.generator.token_logprobs(batch["input_ids"], s.temperature) * batch["response_mask"]
        if self.reference is not None and len(batch["input_ids"]):
            with torch.no_grad():
                batch["ref_logprobs"] = self.reference(batch["input_ids"]) * batch["response_mask"]
        batch.metrics = self._metrics(groups, [] if empty else kept, rollout_s)
        batch.metrics["rl/empty_step"] = float(empty)
        return batch

    def _tensors(self, kept: list[tuple[Prompt, list[Rollout], dict[str, list[float]]]]) -> RolloutBatch:
        rows, advantages, masks, logps = [], [], [], []
        for prompt, group, rewards in kept:
            adv = self._advantages(rewards)
            for rollout, a in zip(group, adv.tolist()):
                ids = list(prompt.ids) + rollout.response_ids
                rows.append(ids)
                # targets are ids[1:]: the response's tokens are targets from position len(prompt) - 1
                start = len(prompt.ids) - 1
                masks.append([0.0] * start + [1.0] * len(rollout.response_ids))
                logps.append([0.0] * start + list(rollout.logprobs))
                advantages.append(a)
        width = max((len(r) for r in rows), default=2)
        pad = lambda seq, value, n: seq + [value] * (n - len(seq))  # noqa: E731
        return RolloutBatch(
            input_ids=torch.tensor([pad(r, self.pad_id, width) for r in rows], dtype=torch.long).reshape(-1, width),
            response_mask=torch.tensor([pad(m, 0.0, width - 1) for m in masks]).reshape(-1, width - 1),
            rollout_logprobs=torch.tensor([pad(lp, 0.0, width - 1) for lp in logps]).reshape(-1, width - 1),
            advantages=torch.tensor(advantages, dtype=torch.float32),
        )

    def _advantages(self, rewards: dict[str, list[float]]) -> torch.Tensor:
        """One advantage per sample of a group: leave-one-out over its total rewards."""
        return leave_one_out(torch.tensor(rewards["total"], dtype=torch.float32), self.settings.scale_by_std)

    def _metrics(self, groups, kept, rollout_s: float) -> dict[str, float]:
        every = [r for _, _, r in groups]
        out: dict[str, float] = {}
        for name in every[0] if every else []:
            values = [v for r in every for v in r[name]]
            out[f"rl/reward/{name}"] = sum(values) / len(values)
        out |= sample_metrics(groups, rollout_s, "rl")
        out["rl/groups"] = float(len(groups))
        out["rl/kept_groups"] = float(len(kept))
        out["rl/dropped_groups"] = float(len(groups) - len(kept))
        out["rl/rollout_seconds"] = rollout_s
        return out


def sample_metrics(groups: list[tuple[Prompt, list[Rollout], dict[str, list[float]]]], rollout_s: float,
                   prefix: str) -> dict[str, float]:
    """What every sampled batch reports (RL, distillation): the verifier's accuracy per domain (when
    the groups were scored), response length, the share cut at max_new_tokens, sampling tokens/s."""
    out: dict[str, float] = {}
    by_domain: dict[str, list[float]] = {}
    for prompt, _, rewards in groups:
        if "accuracy" in rewards:
            by_domain.setdefault(prompt.domain, []).extend(rewards["accuracy"])
    out |= {f"{prefix}/train_accuracy/{d}": sum(v) / len(v) for d, v in sorted(by_domain.items())}
    rollouts = [r for _, group, _ in groups for r in group]
    generated = sum(len(r.response_ids) for r in rollouts)
    out[f"{prefix}/response_length"] = generated / max(len(rollouts), 1)
    out[f"{prefix}/truncated_fraction"] = sum(not r.finished for r in rollouts) / max(len(rollouts), 1)
    out[f"{prefix}/rollout_tokens_per_s"] = generated / max(rollout_s, 1e-9)
    return out


# ---------------------------------------------------------------------- (de)serialising a batch

def encode_batch(batch: RolloutBatch) -> dict[str, Any]:
    """A batch as JSON-able data (exact: tensors as base64 safetensors)."""
    tensors = {k: v.contiguous() for k, v in batch.items()}
    return {"tensors": base64.b64encode(st_save(tensors)).decode("ascii"), "metrics": dict(batch.metrics)}


def decode_batch(doc: dict[str, Any]) -> RolloutBatch:
    batch = RolloutBatch(st_load(base64.b64decode(doc["tensors"])))
    batch.metrics = dict(doc.get("metrics") or {})
    return batch


# ---------------------------------------------------------------------- profiling and evaluation

def pass_rates(generator: Generator, prompts: list[Prompt], score: Score, samples: int, max_new_tokens: int,
               temperature: float, seed: int, chunk: int = 16) -> dict[str, list[float]]:
    """Each prompt's verifier results over `samples` responses (temperature 0: one greedy answer).

    Used for the difficulty profile (the starting policy, k samples), re-profiling on plateau,
    and held-out pass@1 (mean over samples and prompts). Chunked so the generator's batch
    holds `chunk` x samples rows."""
    out: dict[str, list[float]] = {}
    n = 1 if temperature <= 0 else samples
    for start in range(0, len(prompts), chunk):
        part = prompts[start:start + chunk]
        groups = generator.generate([list(p.ids) for p in part], n, max_new_tokens, temperature,
                                    seed_for(seed, "profile", start))
        for prompt, group in zip(part, groups):
            out[prompt.id] = list(score(prompt, group)["accuracy"])
    return out
