"""build_corpus: a recipe's sources -> Megatron indexed shards, per work unit, resumable.

    result = build_corpus(sources, base_dir, world_dir, tokenizer_dir, cfg, validation_fraction, seed, out)

Layout of `out`:
    plan.json                         the shard plan and every setting that shapes the output (data/corpus/plan.py)
    shards/<source>/train/part-NNNNN.bin|.idx   one pair per work unit with documents in that split
    shards/<source>/val/part-NNNNN.bin|.idx
    corpus.json                       the manifest: per source its shards (prefix, documents, tokens), documents
                                      read, rejected by reason, duplicates removed, bad lines skipped
    build_report.json                 how this run went: executor, seconds per phase, units redone, rates
    .work/                            the steps' results (scan hashes, write records), kept for reruns

corpus.json and the shards hold nothing an executor decides, so the in-process and Ray paths give the
same bytes; build_report.json is the one file that differs. A rerun after a crash finds the finished
units' results in .work/ and redoes only the rest.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from stagewise.data.atomic import write_file
from stagewise.data.config import SourceConfig
from stagewise.data.corpus.config import CorpusBuildConfig
from stagewise.data.corpus.executors import executor_for
from stagewise.data.corpus.plan import PLAN, freeze_plan, make_plan, units_of
from stagewise.data.corpus.steps import find_duplicates, scan_unit, write_unit
from stagewise.data.digest import file_sha256
from stagewise.data.indexed_format import indexed_dtype
from stagewise.data.tokenizer import load_tokenizer

MANIFEST, REPORT, WORK = "corpus.json", "build_report.json", ".work"
CORPUS_FORMAT = 1


@dataclass(frozen=True)
class CorpusBuild:
    """A finished build: where it is, its manifest and how this run went."""

    out: Path
    manifest: dict
    report: dict

    def to_dict(self) -> dict:
        return {"out": str(self.out), "manifest": self.manifest, "report": self.report}


def _settings(cfg: CorpusBuildConfig, tokenizer_dir: Path, validation_fraction: float, seed: int) -> dict:
    """Everything besides the inputs that shapes the output bytes (recorded in the plan)."""
    tok = load_tokenizer(tokenizer_dir)
    files = sorted(p for p in tokenizer_dir.rglob("*") if p.is_file())
    return {"filters": cfg.filters.model_dump(), "exact_dedup": cfg.dedup.exact, "partitions": cfg.dedup.partitions,
            "validation_fraction": validation_fraction, "seed": seed,
            "tokenizer": {"dir": str(tokenizer_dir), "vocab_size": len(tok), "eos_id": tok.eos_token_id,
                          "dtype": indexed_dtype(len(tok)).name,
                          "files": [[p.relative_to(tokenizer_dir).as_posix(), file_sha256(p)] for p in files]}}


def build_corpus(sources: list[SourceConfig], base_dir: Path, world_dir: Path | None, tokenizer_dir: Path,
                 cfg: CorpusBuildConfig, validation_fraction: float, seed: int, out: Path,
                 progress: bool = False) -> CorpusBuild:
    """Plan, scan, deduplicate and write; see the module docstring."""
    out, tokenizer_dir = Path(out).resolve(), Path(tokenizer_dir).resolve()
    plan = make_plan(sources, Path(base_dir), world_dir, max(1, int(cfg.shard_mb * 1024**2)))
    plan["settings"] = _settings(cfg, tokenizer_dir, validation_fraction, seed)
    plan = freeze_plan(plan, out)
    units, work, parts = units_of(plan), str(out / WORK), cfg.dedup.partitions
    seconds: dict[str, float] = {}
    written_before = sum((out / WORK / "done" / f"{u.name}.json").is_file() for u in units)
    t0 = time.monotonic()
    with executor_for(cfg, progress) as run:
        seconds["start"] = time.monotonic() - t0
        t = time.monotonic()
        scans = run.map(scan_unit, [(u, cfg.filters, parts, work) for u in units], "scanning")
        seconds["scan"] = time.monotonic() - t
        drops: dict[int, list[int]] = defaultdict(list)
        t = time.monotonic()
        if cfg.dedup.exact:
            calls = [(p, [(s["unit"], s["bounds"][p], s["bounds"][p + 1]) for s in scans], work) for p in range(parts)]
            for found in run.map(find_duplicates, calls, "dedup"):
                for unit, ordinal in found:
                    drops[unit].append(ordinal)
        seconds["dedup"] = time.monotonic() - t
        t = time.monotonic()
        settings = plan["settings"]
        records = run.map(write_unit, [(u, sorted(drops[u.id]), settings["tokenizer"]["dir"], validation_fraction,
                                        seed, str(out), work) for u in units], "tokenizing")
        seconds["write"] = time.monotonic() - t
        executor, nodes = run.name, len(run.nodes)
    seconds["total"] = time.monotonic() - t0
    manifest = _manifest(plan, (out / PLAN).read_bytes(), scans, records)
    write_file(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    docs = sum(s["docs"] for s in scans)
    tokens = sum(src["train_tokens"] + src["val_tokens"] for src in manifest["sources"].values())
    report = {"executor": executor, "workers": cfg.ray.workers if executor == "ray" else 1, "nodes": nodes,
              "units": len(units), "units_written_before": written_before,
              "units_written_now": len(units) - written_before, "input_bytes": sum(u.bytes for u in units),
              "docs": docs, "tokens": tokens, "seconds": {k: round(v, 3) for k, v in seconds.items()},
              "docs_per_s": round(docs / seconds["total"], 1) if seconds["total"] else None,
              "tokens_per_s": round(tokens / seconds["total"], 1) if seconds["total"] else None}
    write_file(out / REPORT, json.dumps(report, indent=1, sort_keys=True).encode())
    return CorpusBuild(out, manifest, report)


def _manifest(plan: dict, plan_bytes: bytes, scans: list[dict], records: list[dict]) -> dict:
    """Per source: shards in plan order, documents read, kept, rejected by reason, duplicates, bad lines."""
    sources: dict[str, dict] = {}
    for unit in plan["units"]:
        sources.setdefault(unit["source"], {"docs": 0, "kept": 0, "rejected": {}, "duplicates": 0, "bad_lines": 0,
                                            "train_tokens": 0, "val_tokens": 0, "train": [], "val": []})
    for scan, record in zip(scans, records):
        s = sources[scan["source"]]
        s["docs"] += scan["docs"]
        s["bad_lines"] += scan["bad_lines"]
        for reason, n in scan["rejected"].items():
            s["rejected"][reason] = s["rejected"].get(reason, 0) + n
        s["kept"] += record["kept"]
        s["duplicates"] += record["duplicates"]
        for split in ("train", "val"):
            if record[split] is not None:
                s[split].append(record[split])
                s[f"{split}_tokens"] += record[split]["tokens"]
    return {"format": CORPUS_FORMAT, "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
            "tokenizer": {k: v for k, v in plan["settings"]["tokenizer"].items() if k != "files"},
            "sources": sources}
