"""Prefect task: a recipe's sources as Megatron indexed shards (data/corpus/), logged to the data step's run.

    summary = corpus_build_task(data, tokenizer, workdir, seed, base_dir, out, tracker, run_id)

The build itself is data/corpus/build.py's (in process or on Ray, as `data.build` says); this task adds
what a person reads in MLflow: data/corpus/metrics.py's metrics at step 0 (docs/s, tokens/s, seconds per
phase, per source tokens, rejects by reason and duplicates removed) and the manifest and the run's report
as artifacts under `corpus/`. A rerun after a crash redoes only unfinished work units, so Prefect's retry
of a transient failure costs what was left, not the whole build.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from stagewise.data.config import DataConfig, TokenizerConfig
from stagewise.data.corpus.build import MANIFEST, REPORT, build_for_recipe
from stagewise.data.corpus.metrics import build_metrics
from stagewise.store.policy import retrying, run_logger
from stagewise.store.tracking import Tracker

ARTIFACT_DIR = "corpus"


@task(**retrying("corpus-build"))
def corpus_build_task(data: DataConfig, tokenizer: TokenizerConfig, workdir: str, seed: int, base_dir: str,
                      out: str | None = None, tracker: Tracker | None = None, run_id: str | None = None) -> dict:
    """Build (or finish) the corpus; log it to `run_id`. Returns {out, manifest, report}."""
    built = build_for_recipe(data, tokenizer, Path(workdir), seed, Path(base_dir), Path(out) if out else None)
    rep = built.report
    log = run_logger()
    log.info("corpus %s: %s, %d work units (%d written now), %s tokens at %s tokens/s", built.out, rep["executor"],
             rep["units"], rep["units_written_now"], f"{rep['tokens']:,}", f"{rep['tokens_per_s'] or 0:,.0f}")
    for name, s in built.manifest["sources"].items():
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(s["rejected"].items())) or "none"
        log.info("corpus %s: %s of %s docs kept; duplicates %s exact, %s near; rejected: %s", name, f"{s['kept']:,}",
                 f"{s['docs']:,}", f"{s['duplicates']['exact']:,}", f"{s['duplicates']['near']:,}", rejected)
    if tracker and run_id:
        tracker.log_metrics(run_id, [(0, 0, build_metrics(built.manifest, rep))])
        for name in (MANIFEST, REPORT):
            tracker.log_artifact(run_id, built.out / name, ARTIFACT_DIR)
    return built.to_dict()
