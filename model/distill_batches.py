"""Distillation batches: the student samples, each sample's teacher scores its tokens.

    batches = DistillBatches(policy, generator, prompts, sampler, teachers, settings, seed, pad_id)
    Trainer(policy, train_cfg, batches, GRPOObjective(cfg), ...)    # the same engine and loss as RL

One step s: the sampler picks the step's prompts (fixed domain ratios), the student (through
the rollout generator) samples `group_size` responses per prompt, `teachers(domains,
sequences, temperature)` returns each sequence's log-probs under the teacher of its domain
(model/teachers.py's router), and the batch carries per-token advantages
log π_T(y_t) - log π_S(y_t) (model/objectives/distill.py). Nothing is dropped: every sampled
token carries the teacher's signal, unlike a GRPO group whose rewards agree.

Everything else is RL's (model/rl_batches.py, which this class extends): one-step off-policy
sampling in a background thread from the weights a step starts from, the pending batch in the
checkpoint for an exact resume, optional π_old recomputation, deterministic draws per (seed,
step). A `score` (the verifiers, optional) only reports the student's training accuracy per
domain; it never changes the loss.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from stagewise.model.objectives.distill import distill_advantages, reverse_kl, scored
from stagewise.model.objectives.grpo import RolloutBatch
from stagewise.model.rl_batches import (
    Prompt,
    RolloutBatches,
    Sampler,
    SamplingSettings,
    Score,
    sample_metrics,
    seed_for,
)
from stagewise.model.rollout import Generator, Rollout

TeacherScores = Callable[..., list[torch.Tensor]]
"""(domains, sequences, temperature, score_from=...) -> per sequence, log π_T(s[t+1] | s[:t+1]) of
len(s) - 1 (0 allowed before score_from[i], the first response token: model/teachers.py)."""


class DistillBatches(RolloutBatches):
    """The engine's batch source for on-policy distillation (see the module docstring)."""

    def __init__(self, policy: torch.nn.Module, generator: Generator, prompts: dict[str, Prompt], sampler: Sampler,
                 teachers: TeacherScores, settings: SamplingSettings, seed: int, pad_id: int, discount: float = 0.0,
                 score: Score | None = None):
        super().__init__(policy, generator, prompts, sampler, score or _unscored, settings, seed, pad_id)
        self.teachers, self.discount, self.scored = teachers, discount, score is not None

    def _collect(self, step: int, with_old: bool) -> RolloutBatch:
        s = self.settings
        started = time.perf_counter()
        chosen = [self.prompts[i] for i in self.sampler.sample(step, 0)]
        sampled = self.generator.generate([list(p.ids) for p in chosen], s.group_size, s.max_new_tokens,
                                          s.temperature, seed_for(self.seed, "rollout", step, 0))
        rollout_s = time.perf_counter() - started
        groups = [(p, g, self.score(p, g) if self.scored else {"total": [0.0] * len(g)})
                  for p, g in zip(chosen, sampled)]
        batch = self._tensors(groups)  # advantages replaced below: per token, from the teachers
        width = batch["input_ids"].shape[1]
        domains = [p.domain for p, g, _ in groups for _ in g]
        sequences = [list(p.ids) + r.response_ids for p, g, _ in groups for r in g]
        started_t = time.perf_counter()
        scored = self.teachers(domains, sequences, s.temperature,
                               score_from=[len(p.ids) for p, g, _ in groups for _ in g])
        teacher_s = time.perf_counter() - started_t
        teacher = torch.zeros(len(sequences), width - 1)
        for row, lp in enumerate(scored):
            teacher[row, :len(lp)] = lp.float()
        mask = batch["response_mask"]
        teacher = torch.where(mask > 0, teacher, torch.zeros_like(teacher))  # keeps NaN / -9999 where unscored
        batch["advantages"] = distill_advantages(teacher, batch["rollout_logprobs"], mask, self.discount)
        if with_old and s.recompute_old_logprobs and len(batch["input_ids"]):  # under the weights that sampled
            batch["old_logprobs"] = self.generator.token_logprobs(batch["input_ids"], s.temperature) * mask
        batch.metrics = self._distill_metrics(groups, domains, teacher, batch["rollout_logprobs"], mask,
                                              rollout_s, teacher_s)
        return batch

    def _advantages(self, rewards: dict[str, list[float]]) -> torch.Tensor:
        return torch.zeros(len(rewards["total"]))  # per token instead: set in _collect

    def _distill_metrics(self, groups: list[tuple[Prompt, list[Rollout], dict[str, list[float]]]], domains: list[str],
                         teacher: torch.Tensor, student: torch.Tensor, mask: torch.Tensor, rollout_s: float,
                         teacher_s: float) -> dict[str, float]:
        """Per domain: reverse KL per token, the teacher - student log-prob gap per response, and
        (with a score) the student's training accuracy; plus lengths and throughput."""
        unscored = ((mask > 0) & ~scored(teacher)).sum() / mask.sum().clamp(min=1)
        out: dict[str, float] = {"distill/reverse_kl": reverse_kl(teacher, student, mask),
                                 "distill/unscored_fraction": float(unscored)}
        for domain in sorted(set(domains)):
            rows = torch.tensor([d == domain for d in domains])
            out[f"distill/reverse_kl/{domain}"] = reverse_kl(teacher[rows], student[rows], mask[rows])
            on = (mask[rows] > 0) & scored(teacher[rows])
            gap = torch.where(on, teacher[rows] - student[rows], torch.zeros_like(student[rows])).sum(-1)
            out[f"distill/logprob_gap/{domain}"] = float(gap.mean()) if len(gap) else 0.0
        out |= sample_metrics(groups, rollout_s, "distill")
        out["distill/teacher_tokens_per_s"] = float(mask.sum()) / max(teacher_s, 1e-9)
        return out


def _unscored(prompt: Prompt, group: list[Rollout]) -> dict[str, list[float]]:
    return {"total": [0.0] * len(group)}


__all__ = ["DistillBatches", "TeacherScores"]
