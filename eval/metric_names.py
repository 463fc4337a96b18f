"""The names the stages' own evaluations log, in one place (no torch, no Prefect).

    validation_metric_names(["facts", "stdlib"])  # loss, perplexity, facts_loss, stdlib_loss, unigram_baseline
    heldout_metric_names(["arithmetic"])          # answered, exact_match, exact_match_arithmetic, ..., loss

tasks/evaluate.py logs validation loss under VALIDATION_PREFIX and the held-out conversations
of each split (eval/splits.py) under `heldout_prefix(split)`; eval/validation.py and eval/heldout.py compute the numbers. A gate may name
any of them, so the recipe doctor (recipe/doctor/facts.py) reads the same names from here to tell
a gate metric that no evaluation produces before any training starts. Suite tasks' names
(`eval/<task>/<metric>`) are eval/harness.py's (`local_metric_names`).
"""

from __future__ import annotations

from collections.abc import Iterable

SUITE_PREFIX = "eval"
"""Suite metrics are logged as `eval/<task>/<metric>` (tasks/evaluate.py suite_task)."""
VALIDATION_PREFIX = "eval/validation"
"""Where a stage logs validation_loss's numbers (tasks/evaluate.py validation_task)."""
UNIGRAM_BASELINE = "unigram_baseline"
"""The prepared data's unigram cross-entropy, logged next to the validation loss: the floor to beat."""


def heldout_prefix(split: str) -> str:
    """Where a stage logs the held-out conversations' numbers of one split (tasks/evaluate.py
    heldout_task): `eval/sft_dev/<metric>`, `eval/sft_test/<metric>`."""
    return f"{SUITE_PREFIX}/sft_{split}"

ANSWER_SCORES = ("exact_match", "format_match")
"""What eval/heldout.py heldout_answers scores, overall and per domain as `<score>_<domain>`."""
BOUND_ENDS = ("_low", "_high")
"""Each rate's 95% interval is logged next to it as `<rate>_low`, `<rate>_high` (eval/intervals.py)."""


def validation_metric_names(sources: Iterable[str]) -> list[str]:
    """Every name validation_task logs under VALIDATION_PREFIX for streams of these sources:
    eval/validation.py validation_loss's keys and the unigram baseline."""
    return ["loss", "perplexity", *(f"{s}_loss" for s in sources), UNIGRAM_BASELINE]


def heldout_metric_names(domains: Iterable[str]) -> list[str]:
    """Every name heldout_task logs under `heldout_prefix(split)` for conversations of these domains:
    heldout_answers' (answered, the scores, per domain, each score's interval bounds) and heldout_loss's
    (loss, supervised tokens)."""
    domains = list(domains)
    rates = [*ANSWER_SCORES, *(f"{score}_{d}" for score in ANSWER_SCORES for d in domains)]
    return ["answered", *rates, *(f"{r}{end}" for r in rates for end in BOUND_ENDS), "loss", "supervised_tokens"]
