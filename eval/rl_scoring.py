"""Held-out scoring of RL rows: pass@1 over samples and greedy accuracy, per domain.

The number the RL stage logs as `rl/<split>/...`, distillation as `distill/<split>/...` and
`stagewise eval --rows` prints. What decides it (the weights, the prompts' token ids and rows, the
sampling settings, the generator's kind and precision) is `heldout_spec`: the memo key under which
the same checkpoint scored the same way is scored once (eval/score_memo.py).
"""

from __future__ import annotations

from typing import Any

from stagewise.eval.rl_wiring import RL_DATA_VERSION, RLWiring, by_domain
from stagewise.model.rl_batches import pass_rates

ITEMS = "items"
"""The key of heldout_scores' per-prompt results (every other key is a score kind, per domain)."""

HELDOUT_KIND = "heldout"
"""The memo kind of held-out RL scores: on disk `<stages>/heldout-<hash>/scores.json`."""


def heldout_spec(weights: str, generator: Any, wiring: RLWiring, ids: list[str], settings: list) -> dict:
    """What decides a held-out score of `ids`: the weights' sha256, the prompts (ids, token ids,
    rows), the settings (samples, tokens, temperature, seed) and the generator's kind, plus its
    precision when it samples in bf16 (rollout.sampler_precision: a bf16 sampler scores other numbers)."""
    prompts = [[i, list(wiring.prompts[i].ids), wiring.rows[i].environment,
                wiring.rows[i].row.model_dump(mode="json")] for i in ids]
    spec = {"weights": weights, "prompts": prompts, "settings": settings,
            "generator": type(generator).__name__, "version": RL_DATA_VERSION}
    precision = getattr(generator, "precision", "trainer")
    if precision != "trainer":
        spec["precision"] = precision
    return spec


def heldout_scores(generator, wiring: RLWiring, ids: list[str], samples: int, max_new_tokens: int,
                   temperature: float, seed: int) -> dict[str, dict[str, float]]:
    """{"pass_at_1": per domain, "greedy": per domain, "items": {"pass_at_1": per prompt}} of the
    prompts `ids` (a prompt's pass@1: the mean over its samples; no logging, no memo: the RL task
    and eval/score_rows.py add what each needs)."""
    prompts = [wiring.prompts[i] for i in ids]
    rates = pass_rates(generator, prompts, wiring.score, samples, max_new_tokens, temperature, seed)
    greedy = by_domain(pass_rates(generator, prompts, wiring.score, 1, max_new_tokens, 0.0, seed), wiring)
    return {"pass_at_1": by_domain(rates, wiring), "greedy": greedy,
            ITEMS: {"pass_at_1": {pid: sum(v) / len(v) for pid, v in rates.items()}}}
