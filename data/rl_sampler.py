"""Which prompts each RL step trains on: the Gaussian curriculum over profiled pass rates, as a sampler.

    sampler = CurriculumSampler({"arithmetic": [("a-1", 0.25), ...], "format": [...]},
                                ratios={"arithmetic": 0.5, "format": 0.5}, batch_size=16,
                                total_steps=60, cfg=CurriculumConfig(), seed=1234)
    sampler.sample(step=7, attempt=0)  # prompt ids for step 7 (deterministic)

The rule itself (per-domain counts by largest remainder, Gaussian bin shares whose mean moves
from easy to hard, caps and shortfall) is data/rl_curriculum.py's `sample_batch`; this class
binds it to a run: every draw uses an RNG seeded by (seed, step, attempt), so a draw depends
on nothing but its step, and the only state worth saving is the pass-rate table (replaced
when the stage re-profiles on a plateau). Without a curriculum (`cfg=None`) a step takes its
per-domain counts uniformly at random from each domain.
"""

from __future__ import annotations

from typing import Any

from stagewise.data.rl_curriculum import CurriculumConfig, largest_remainder, sample_batch
from stagewise.data.world._common import rng_for


def domain_counts(ratios: dict[str, float], batch_size: int) -> dict[str, int]:
    """`batch_size` split over domains in proportion to `ratios`, by largest remainder (ties: the
    earlier domain), as the curriculum splits its batches."""
    return dict(zip(ratios, largest_remainder(batch_size, list(ratios.values()))))


class CurriculumSampler:
    """The RL batch source's sampler (model/rl_batches.Sampler)."""

    def __init__(self, prompts: dict[str, list[tuple[str, float]]], ratios: dict[str, float], batch_size: int,
                 total_steps: int, cfg: CurriculumConfig | None, seed: int):
        missing = sorted(d for d in ratios if not prompts.get(d))
        if missing:
            raise ValueError(f"no prompts left to train on in domain(s) {', '.join(missing)} "
                             "(the difficulty filter may have dropped them all: every one was solved)")
        self.prompts, self.ratios, self.batch_size = prompts, dict(ratios), batch_size
        self.total_steps, self.cfg, self.seed = total_steps, cfg, seed

    def sample(self, step: int, attempt: int) -> list[str]:
        rng = rng_for(self.seed, f"curriculum:{step}:{attempt}")
        if self.cfg is not None:
            # sample_batch counts steps from 0; the engine's first step is 1
            return sample_batch(self.prompts, self.ratios, self.batch_size, step - 1, self.total_steps, self.cfg, rng)
        picked: list[str] = []
        for domain, n in sorted(domain_counts(self.ratios, self.batch_size).items()):
            ids = [i for i, _ in self.prompts[domain]]
            picked += rng.sample(ids, n) if n <= len(ids) else [rng.choice(ids) for _ in range(n)]
        rng.shuffle(picked)
        return picked

    def update(self, pass_rates: dict[str, float]) -> None:
        """New pass rates (a re-profile with the current policy) for the prompts it has."""
        self.prompts = {d: [(i, pass_rates.get(i, p)) for i, p in rows] for d, rows in self.prompts.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"prompts": {d: [[i, p] for i, p in rows] for d, rows in self.prompts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts = {d: [(str(i), float(p)) for i, p in rows] for d, rows in state["prompts"].items()}
