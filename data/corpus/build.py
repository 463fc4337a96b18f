"""build_corpus: a recipe's sources -> Megatron indexed shards, per work unit, resumable.

    result = build_corpus(sources, base_dir, world_dir, tokenizer_dir, cfg, validation_fraction, seed, out)

Layout of `out`:
    plan.json                         the shard plan and every setting that shapes the output (data/corpus/plan.py)
    shards/<source>/train/part-NNNNN.bin|.idx   one pair per work unit with documents in that split
    shards/<source>/val/part-NNNNN.bin|.idx
    corpus.json                       the manifest: per source its shards (prefix, documents, tokens), documents
                                      read, rejected by reason, duplicates removed (exact, near), bad lines skipped
    build_report.json                 how this run went: executor, seconds per phase, units redone, rates
    .work/                            the steps' results (scan hashes, write records), kept for reruns

corpus.json and the shards hold nothing an executor decides, so the in-process and Ray paths give the
same bytes; build_report.json is the one file that differs. A rerun after a crash finds the finished
units' results in .work/ and redoes only the rest.
"""

from __future__ import annotations

import hashlib
import json
import resource
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from stagewise.data.atomic import write_file
from stagewise.data.config import DataConfig, SourceConfig, TokenizerConfig
from stagewise.data.corpus.config import CorpusBuildConfig
from stagewise.data.corpus.curator import curator_missing, curator_plan, run_curator, stage_unit
from stagewise.data.corpus.executors import executor_for
from stagewise.data.corpus.plan import PLAN, freeze_plan, make_plan, units_of
from stagewise.data.corpus.steps import find_duplicates, find_near_pairs, scan_unit, write_unit
from stagewise.data.digest import file_sha256
from stagewise.data.errors import BadInput
from stagewise.data.indexed_format import indexed_dtype
from stagewise.data.prepare import ensure_world, find_prepared
from stagewise.data.tokenizer import existing_tokenizer_dir, load_tokenizer

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
    return {"filters": cfg.filters.model_dump(), "dedup": cfg.dedup.model_dump(),
            "validation_fraction": validation_fraction, "seed": seed,
            "tokenizer": {"dir": str(tokenizer_dir), "vocab_size": len(tok), "eos_id": tok.eos_token_id,
                          "dtype": indexed_dtype(len(tok)).name,
                          "files": [[p.relative_to(tokenizer_dir).as_posix(), file_sha256(p)] for p in files]}}


def build_corpus(sources: list[SourceConfig], base_dir: Path, world_dir: Path | None, tokenizer_dir: Path,
                 cfg: CorpusBuildConfig, validation_fraction: float, seed: int, out: Path,
                 progress: bool = False) -> CorpusBuild:
    """Plan, scan, deduplicate and write; see the module docstring."""
    out, tokenizer_dir = Path(out).resolve(), Path(tokenizer_dir).resolve()
    if cfg.dedup.curator_near and (missing := curator_missing()) is not None:
        raise BadInput(f"data.build.dedup.engine: curator cannot run on this machine: {missing}. "
                       "`stagewise data build --dry-run` shows the Curator calls it would make; "
                       "data.build.dedup.engine=builtin removes near duplicates on any machine")
    plan = make_plan(sources, Path(base_dir), world_dir, max(1, int(cfg.shard_mb * 1024**2)))
    plan["settings"] = _settings(cfg, tokenizer_dir, validation_fraction, seed)
    plan = freeze_plan(plan, out)
    units, work, dedup = units_of(plan), str(out / WORK), cfg.dedup
    seconds: dict[str, float] = {}
    written_before = sum((out / WORK / "done" / f"{u.name}.json").is_file() for u in units)
    t0 = time.monotonic()
    with executor_for(cfg, progress) as run:
        seconds["start"] = time.monotonic() - t0
        t = time.monotonic()
        scans = run.map(scan_unit, [(u, cfg.filters, dedup, work) for u in units], "scanning")
        seconds["scan"] = time.monotonic() - t
        t = time.monotonic()
        dropped: dict[tuple[int, int], str] = {}
        if dedup.exact:
            calls = [(p, _slices(scans, "bounds", p), work) for p in range(dedup.partitions)]
            for found in run.map(find_duplicates, calls, "exact dedup"):
                dropped |= {doc: "exact" for doc in found}
        if dedup.curator_near:
            exact = _by_unit(dropped)
            run.map(stage_unit, [(u, cfg.filters, exact[u.id], work) for u in units], "curator input")
            dropped |= run_curator(curator_plan(units, dedup, work))
        if dedup.builtin_near:
            calls = [(p, _slices(scans, "near_bounds", p), dedup.threshold, dedup.max_bucket, work)
                     for p in range(dedup.partitions)]
            pairs = {tuple(pair) for found in run.map(find_near_pairs, calls, "near dedup") for pair in found}
            dropped |= near_drops(pairs, dropped)
        drops = _by_unit(dropped)
        seconds["dedup"] = time.monotonic() - t
        t = time.monotonic()
        settings = plan["settings"]
        records = run.map(write_unit, [(u, drops[u.id], settings["tokenizer"]["dir"], validation_fraction,
                                        seed, str(out), work) for u in units], "tokenizing")
        seconds["write"] = time.monotonic() - t
        executor, nodes = run.name, len(run.nodes)
    seconds["total"] = time.monotonic() - t0
    manifest = _manifest(plan, (out / PLAN).read_bytes(), scans, records, dropped)
    write_file(out / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    docs = sum(s["docs"] for s in scans)
    tokens = sum(src["train_tokens"] + src["val_tokens"] for src in manifest["sources"].values())
    report = {"executor": executor, "workers": cfg.ray.workers if executor == "ray" else 1, "nodes": nodes,
              "units": len(units), "units_written_before": written_before,
              "units_written_now": len(units) - written_before, "input_bytes": sum(u.bytes for u in units),
              "docs": docs, "tokens": tokens, "seconds": {k: round(v, 3) for k, v in seconds.items()},
              "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "docs_per_s": round(docs / seconds["total"], 1) if seconds["total"] else None,
              "tokens_per_s": round(tokens / seconds["total"], 1) if seconds["total"] else None}
    write_file(out / REPORT, json.dumps(report, indent=1, sort_keys=True).encode())
    return CorpusBuild(out, manifest, report)


def _by_unit(dropped: dict[tuple[int, int], str]) -> dict[int, list[int]]:
    """The dropped documents' ordinals per unit, sorted (every unit has a list, maybe empty)."""
    out: dict[int, list[int]] = defaultdict(list)
    for unit, ordinal in sorted(dropped):
        out[unit].append(ordinal)
    return out


def preview_corpus(sources: list[SourceConfig], base_dir: Path, world_dir: Path | None, cfg: CorpusBuildConfig,
                   out: Path) -> dict:
    """What a build would do, doing none of it (`stagewise data build --dry-run`): the work units per source,
    the executor, and with dedup.engine=curator the Curator calls (data/corpus/curator.py) and whether they
    could run here. Reads only the inputs' sizes (and parquet footers); writes nothing (the caller makes the demo
    world first when the recipe has one)."""
    out = Path(out).resolve()
    units = units_of(make_plan(sources, Path(base_dir), world_dir, max(1, int(cfg.shard_mb * 1024**2))))
    per_source: dict[str, dict] = {}
    for u in units:
        s = per_source.setdefault(u.source, {"files": set(), "units": 0, "bytes": 0})
        s["files"].add(u.file)
        s["units"] += 1
        s["bytes"] += u.bytes
    dedup = cfg.dedup
    return {"out": str(out), "executor": cfg.executor, "workers": cfg.ray.workers if cfg.executor == "ray" else 1,
            "units": len(units), "input_bytes": sum(u.bytes for u in units),
            "sources": {name: {**s, "files": len(s["files"])} for name, s in per_source.items()},
            "dedup": {"exact": dedup.exact, "near": dedup.engine if dedup.near else None},
            "curator": ({"plan": curator_plan(units, dedup, str(out / WORK)), "missing": curator_missing()}
                        if dedup.curator_near else None)}


def build_for_recipe(data: DataConfig, tokenizer: TokenizerConfig, workdir: Path, seed: int, base_dir: Path,
                     out: Path | None = None, tokenizer_dir: Path | None = None, progress: bool = False) -> CorpusBuild:
    """build_corpus for a recipe's data block: its demo world made when it has one, into `out` (default
    `<workdir>/corpus`), tokenized by `tokenizer_dir`, else the recipe's tokenizer.path, else the tokenizer
    `data prepare` trained for it (BadInput when there is none yet)."""
    workdir, base_dir = Path(workdir), Path(base_dir)
    if tokenizer_dir is None and tokenizer.path is not None:
        tokenizer_dir = existing_tokenizer_dir(tokenizer, base_dir)
    if tokenizer_dir is None:
        prepared = find_prepared(data, tokenizer, workdir, seed, base_dir)
        if prepared is None:
            raise BadInput(f"tokenizer: no tokenizer.path and no prepared tokenizer under {workdir / 'data'} for this "
                           "recipe: run `stagewise data prepare` on it first, or name a tokenizer directory")
        tokenizer_dir = prepared.tokenizer_dir
    if not Path(tokenizer_dir).is_dir():
        raise BadInput(f"tokenizer {tokenizer_dir}: not a directory")
    world = ensure_world(data.world, seed, workdir) if data.world is not None else None
    return build_corpus(data.sources, base_dir, world, Path(tokenizer_dir), data.build, data.validation_fraction, seed,
                        out or workdir / "corpus", progress=progress)


def _slices(scans: list[dict], key: str, partition: int) -> list[tuple[int, int, int]]:
    """(unit, lo, hi) of one hash partition in every unit's scan file."""
    return [(s["unit"], s[key][partition], s[key][partition + 1]) for s in scans]


def near_drops(pairs: set[tuple[int, int, int, int]], dropped: dict[tuple[int, int], str]) -> dict[tuple[int, int], str]:
    """The documents near dedup drops: in plan order, each one with a verified partner before it that is kept.

    The streaming rule (curate/dedup.py) over the whole corpus: an earlier document already dropped, as an exact
    or near duplicate, drops nothing; so a chain a ~ b ~ c with a !~ c keeps a and c."""
    earlier: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for u1, o1, u2, o2 in pairs:
        earlier[(u2, o2)].append((u1, o1))
    out: dict[tuple[int, int], str] = {}
    for doc in sorted(earlier):
        if doc not in dropped and any(e not in dropped and e not in out for e in earlier[doc]):
            out[doc] = "near"
    return out


def _manifest(plan: dict, plan_bytes: bytes, scans: list[dict], records: list[dict],
              dropped: dict[tuple[int, int], str]) -> dict:
    """Per source: shards in plan order, documents read, kept, rejected by reason, duplicates, bad lines."""
    sources: dict[str, dict] = {}
    for unit in plan["units"]:
        sources.setdefault(unit["source"], {"docs": 0, "kept": 0, "rejected": {}, "duplicates": {"exact": 0, "near": 0},
                                            "bad_lines": 0,
                                            "train_tokens": 0, "val_tokens": 0, "train": [], "val": []})
    for scan, record in zip(scans, records):
        s = sources[scan["source"]]
        s["docs"] += scan["docs"]
        s["bad_lines"] += scan["bad_lines"]
        for reason, n in scan["rejected"].items():
            s["rejected"][reason] = s["rejected"].get(reason, 0) + n
        s["kept"] += record["kept"]
        for split in ("train", "val"):
            if record[split] is not None:
                s[split].append(record[split])
                s[f"{split}_tokens"] += record[split]["tokens"]
    source_of = {u["id"]: u["source"] for u in plan["units"]}
    for (unit, _), reason in dropped.items():
        sources[source_of[unit]]["duplicates"][reason] += 1
    return {"format": CORPUS_FORMAT, "plan_sha256": hashlib.sha256(plan_bytes).hexdigest(),
            "tokenizer": {k: v for k, v in plan["settings"]["tokenizer"].items() if k != "files"},
            "sources": sources}
