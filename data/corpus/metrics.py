"""A corpus build as flat metrics: what the data step logs to its MLflow run (tasks/corpus.py).

    metrics = build_metrics(build.manifest, build.report)

Names (MLflow keys; source names are `[A-Za-z0-9_.-]+`, reasons are the filters' own):
    data/build/docs_per_s, data/build/tokens_per_s     the whole build, Ray's start included
    data/build/seconds/<phase>                         start, scan, dedup, write, total
    data/build/units, data/build/units_written_now     work units planned, and redone by this run
    data/build/nodes, data/build/driver_peak_rss_mb
    data/<source>/{docs,kept,bad_lines,train_tokens,val_tokens,shards}
    data/<source>/rejected/<reason>                    one per reason seen (too_short, symbol_heavy, ...)
    data/<source>/duplicates/{exact,near}
"""

from __future__ import annotations

PHASES = ("start", "scan", "dedup", "write", "total")


def build_metrics(manifest: dict, report: dict) -> dict[str, float]:
    """The build's rates, timings and per-source counts (see the module docstring); every value a number."""
    out: dict[str, float] = {
        "data/build/docs_per_s": report["docs_per_s"] or 0.0,
        "data/build/tokens_per_s": report["tokens_per_s"] or 0.0,
        "data/build/units": report["units"],
        "data/build/units_written_now": report["units_written_now"],
        "data/build/nodes": report["nodes"],
        "data/build/driver_peak_rss_mb": report["driver_peak_rss_mb"],
    }
    out |= {f"data/build/seconds/{phase}": report["seconds"][phase] for phase in PHASES if phase in report["seconds"]}
    for name, source in manifest["sources"].items():
        key = f"data/{name}"
        out |= {f"{key}/{field}": source[field] for field in ("docs", "kept", "bad_lines", "train_tokens", "val_tokens")}
        out[f"{key}/shards"] = len(source["train"]) + len(source["val"])
        out |= {f"{key}/rejected/{reason}": n for reason, n in source["rejected"].items()}
        out |= {f"{key}/duplicates/{kind}": n for kind, n in source["duplicates"].items()}
    return {k: float(v) for k, v in out.items()}
