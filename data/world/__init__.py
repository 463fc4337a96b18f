"""The demo world: pretraining text made on the spot, deterministically from a seed.

`generate_world(cfg, out_dir, seed)` writes one jsonl file per kind (rows `{"text": ...}`):
stdlib.jsonl (real text from this machine), facts.jsonl, arithmetic.jsonl,
retrieval.jsonl and noisy.jsonl. Recipes point at them as `@world/<kind>.jsonl`.
The structured generators (`make_entities`, `make_problem`, `make_retrieval`) are exported
for the stages that ask questions about the same world.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from stagewise.data.config import WorldConfig
from stagewise.data.world._common import rng_for, write_jsonl
from stagewise.data.world.arithmetic import Problem, arithmetic_texts, make_problem, render_problem
from stagewise.data.world.facts import Entity, fact_texts, make_entities, render_entity
from stagewise.data.world.noisy import noisy_texts
from stagewise.data.world.retrieval import RetrievalDoc, make_retrieval, render_retrieval, retrieval_texts
from stagewise.data.world.stdlib import stdlib_texts

WORLD_VERSION = 1
"""Bump when a generator's output changes, so cached worlds and prepared data are rebuilt."""

KINDS: dict[str, Callable[[WorldConfig, int], Iterable[str]]] = {
    "stdlib": lambda cfg, seed: stdlib_texts(cfg.stdlib_files, rng_for(seed, "stdlib")),
    "facts": lambda cfg, seed: fact_texts(cfg.facts, seed),
    "arithmetic": lambda cfg, seed: arithmetic_texts(cfg.arithmetic, seed),
    "retrieval": lambda cfg, seed: retrieval_texts(cfg.retrieval, seed),
    "noisy": lambda cfg, seed: noisy_texts(cfg.noisy, seed),
}


def generate_world(cfg: WorldConfig, out_dir: Path, seed: int) -> dict[str, Path]:
    """Write `<kind>.jsonl` for every kind into out_dir; returns kind -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, texts in KINDS.items():
        paths[kind] = out_dir / f"{kind}.jsonl"
        write_jsonl(paths[kind], texts(cfg, seed))
    return paths


__all__ = ["WORLD_VERSION", "Entity", "Problem", "RetrievalDoc", "generate_world", "make_entities",
           "make_problem", "make_retrieval", "render_entity", "render_problem", "render_retrieval"]
