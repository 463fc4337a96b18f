"""The three steps of a corpus build, each a plain function of one work unit (or one hash partition).

    scan_unit(unit, ...)        read -> filter -> per kept document a 128-bit hash of its normalised text
                                (<work>/scan/<part>.npy) and, for near dedup, its LSH band hashes
                                (<part>.bands.npy), both grouped by hash partition, and its shingle set
                                (<part>.shingles.npy) for verifying candidates
    find_duplicates(p, ...)     one partition of every unit's text hashes: which (unit, ordinal) repeat an
                                earlier document (the exact shuffle's reduce side)
    find_near_pairs(p, ...)     one partition of every unit's band hashes: the pairs sharing a band whose
                                exact shingle Jaccard reaches the threshold (the near shuffle's reduce side;
                                build.py then drops, in plan order, each document with a kept earlier partner)
    write_unit(unit, drops, ...) the kept documents tokenized and written as Megatron indexed shards
                                <out>/shards/<source>/{train,val}/<part>.bin|.idx

Executors (data/corpus/executors.py) run them in this process or as Ray tasks; the arguments and
results are plain data, so a remote worker needs only the shared output directory. Every step
leaves its result on disk, written atomically, and returns it at once when it is already there:
that is what makes a rerun after a crash redo only unfinished units. "Earlier" is shard-plan order
(unit id, then ordinal), so which copy survives never depends on timing.
"""

from __future__ import annotations

import hashlib
import io
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from stagewise.data.atomic import write_file
from stagewise.data.corpus.config import CorpusDedupConfig, FilterConfig
from stagewise.data.corpus.filters import reject_reason
from stagewise.data.corpus.plan import WorkUnit
from stagewise.data.corpus.read import UnitReader
from stagewise.data.curate.dedup import distinct, jaccard
from stagewise.data.curate.minhash import digest_rows, mix64, optimal_bands, shingles
from stagewise.data.curate.text import normalise
from stagewise.data.indexed_format import index_bytes, indexed_dtype
from stagewise.data.shards import ENCODE_BATCH, batched, encoder_for, stable_fraction, stable_int
from stagewise.data.tokenizer import load_tokenizer

HASHES = np.dtype([("h1", "<u8"), ("h2", "<u8"), ("unit", "<u4"), ("ord", "<u4")])
"""A kept document in the shuffle: its text hash and where it is."""


def _done(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def text_hash(text: str) -> tuple[int, int]:
    """Two 64-bit halves of a 128-bit hash of the normalised text (what exact dedup compares)."""
    d = hashlib.blake2b(normalise(text).encode("utf-8"), digest_size=16).digest()
    return int.from_bytes(d[:8], "little"), int.from_bytes(d[8:], "little")


BANDS = np.dtype([("key", "<u8"), ("unit", "<u4"), ("ord", "<u4")])
"""A kept document in one LSH band of the near shuffle: the band's hash and where the document is."""


def _partitioned(records: np.ndarray, key: np.ndarray, partitions: int) -> tuple[np.ndarray, list[int]]:
    """The records grouped by key % partitions, and where each partition starts (partitions + 1 bounds)."""
    part = (key % np.uint64(partitions)).astype(np.int64)
    order = np.argsort(part, kind="stable")
    return records[order], np.searchsorted(part[order], np.arange(partitions + 1)).tolist()


def band_hashes(sigs: np.ndarray, bands: int) -> np.ndarray:
    """[n, bands] uint64: each band of r = P // bands signature rows folded into one 64-bit hash, the band's
    index mixed in (two documents share a bucket when a band's r rows are equal; a 64-bit collision only adds a
    candidate, which verification then rejects)."""
    rows = sigs.shape[1] // bands
    out = np.empty((len(sigs), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for b in range(bands):
            h = np.full(len(sigs), np.uint64(b + 1), dtype=np.uint64)
            for c in sigs[:, b * rows:(b + 1) * rows].T.astype(np.uint64):
                h = mix64(h * np.uint64(0x100000001B3) + c)
            out[:, b] = h
    return out


def scan_unit(unit: WorkUnit, filters: FilterConfig, dedup: CorpusDedupConfig, work: str) -> dict:
    """Filter a unit's documents and record what the dedup shuffles need of the kept ones; the summary
    (also on disk, written last: its presence means the unit's scan is complete)."""
    summary_path = Path(work) / "scan" / f"{unit.name}.json"
    if (done := _done(summary_path)) is not None:
        return done
    reader = UnitReader(unit)
    rows, kept_texts, rejected, docs = [], [], {}, 0
    for ordinal, text in reader:
        docs += 1
        reason = reject_reason(text, filters)
        if reason is not None:
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        rows.append((*text_hash(text), unit.id, ordinal))
        if dedup.builtin_near:
            kept_texts.append(text)
    records = np.array(rows, dtype=HASHES)
    records_by_part, bounds = _partitioned(records, records["h1"], dedup.partitions)
    summary = {"unit": unit.id, "source": unit.source, "docs": docs, "kept": len(records),
               "rejected": dict(sorted(rejected.items())), "bad_lines": reader.bad_lines, "bounds": bounds}
    if dedup.builtin_near:
        summary["near_bounds"] = _scan_near(kept_texts, records["ord"], unit, dedup, summary_path)
    write_file(summary_path.with_suffix(".npy"), _npy_bytes(records_by_part))
    write_file(summary_path, json.dumps(summary, sort_keys=True).encode())
    return summary


def _scan_near(texts: list[str], ords: np.ndarray, unit: WorkUnit, dedup: CorpusDedupConfig, at: Path) -> list[int]:
    """Write the kept documents' band hashes (by partition) and distinct shingle sets; the band bounds."""
    flat, offsets = shingles(texts, dedup.shingle_size)
    bands = dedup.bands or optimal_bands(dedup.threshold, dedup.num_perm)
    keys = (band_hashes(digest_rows(flat, offsets, dedup.num_perm, dedup.minhash_seed), bands) if texts
            else np.zeros((0, bands), dtype=np.uint64))
    records = np.empty(keys.size, dtype=BANDS)
    records["key"] = keys.ravel()
    records["unit"] = unit.id
    records["ord"] = np.repeat(ords, bands)
    records, bounds = _partitioned(records, records["key"], dedup.partitions)
    sets = [distinct(flat[offsets[i]:offsets[i + 1]]) for i in range(len(texts))]
    set_offsets = np.r_[0, np.cumsum([len(x) for x in sets])].astype(np.int64)
    write_file(at.with_suffix(".bands.npy"), _npy_bytes(records))
    write_file(at.with_suffix(".shingles.npy"),
               _npy_bytes(np.concatenate(sets) if sets else np.zeros(0, dtype=np.uint64)))
    write_file(at.with_suffix(".sets.npy"), _npy_bytes(np.stack([np.asarray(ords, dtype=np.int64), set_offsets[:-1],
                                                                 set_offsets[1:]], axis=1)
                                                       if len(ords) else np.zeros((0, 3), dtype=np.int64)))
    return bounds


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _hashes(work: str, unit: int) -> np.ndarray:
    return np.load(Path(work) / "scan" / f"part-{unit:05d}.npy", mmap_mode="r", allow_pickle=False)


def find_duplicates(partition: int, slices: list[tuple[int, int, int]], work: str) -> list[tuple[int, int]]:
    """(unit, ordinal) of every document in this hash partition whose text an earlier one already has.

    `slices` are (unit, lo, hi): where the partition lies in each unit's hash file."""
    parts = [np.asarray(_hashes(work, unit)[lo:hi]) for unit, lo, hi in slices if hi > lo]
    if not parts:
        return []
    rec = np.concatenate(parts)
    rec = rec[np.lexsort((rec["ord"], rec["unit"], rec["h2"], rec["h1"]))]
    repeat = np.zeros(len(rec), dtype=bool)
    repeat[1:] = (rec["h1"][1:] == rec["h1"][:-1]) & (rec["h2"][1:] == rec["h2"][:-1])
    return [(int(u), int(o)) for u, o in zip(rec["unit"][repeat], rec["ord"][repeat])]


def _load(work: str, unit: int, kind: str) -> np.ndarray:
    return np.load(Path(work) / "scan" / f"part-{unit:05d}.{kind}.npy", mmap_mode="r", allow_pickle=False)


def find_near_pairs(partition: int, slices: list[tuple[int, int, int]], threshold: float, max_bucket: int,
                    work: str) -> list[tuple[int, int, int, int]]:
    """(unit, ordinal, unit, ordinal) of every pair of documents, earlier first, that share a band hashed into
    this partition and whose distinct-shingle Jaccard is at least `threshold`.

    `slices` are (unit, lo, hi): where the partition lies in each unit's band file. A bucket of more than
    `max_bucket` documents pairs each later one with its first `max_bucket` only (CorpusDedupConfig)."""
    parts = [np.asarray(_load(work, unit, "bands")[lo:hi]) for unit, lo, hi in slices if hi > lo]
    if not parts:
        return []
    rec = np.concatenate(parts)
    rec = rec[np.lexsort((rec["ord"], rec["unit"], rec["key"]))]
    starts = np.flatnonzero(np.r_[True, rec["key"][1:] != rec["key"][:-1]])
    ends = np.r_[starts[1:], len(rec)]
    pairs: set[tuple[int, int, int, int]] = set()
    for a, b in zip(starts.tolist(), ends.tolist()):
        if b - a < 2:
            continue
        members = list(zip(rec["unit"][a:b].tolist(), rec["ord"][a:b].tolist()))
        for j in range(1, len(members)):
            for i in range(min(j, max_bucket)):
                if members[i] != members[j]:
                    pairs.add((*members[i], *members[j]))
    sets = _ShingleSets(work)
    return sorted(p for p in pairs if jaccard(sets.get(p[0], p[1]), sets.get(p[2], p[3])) >= threshold)


class _ShingleSets:
    """A kept document's distinct shingle hashes, read from its unit's scan files (each unit opened once)."""

    def __init__(self, work: str) -> None:
        self.work, self.units = work, {}

    def get(self, unit: int, ordinal: int) -> np.ndarray:
        if unit not in self.units:
            self.units[unit] = (_load(self.work, unit, "sets"), _load(self.work, unit, "shingles"))
        index, flat = self.units[unit]
        row = index[np.searchsorted(index[:, 0], ordinal)]
        return np.asarray(flat[row[1]:row[2]])


@lru_cache(maxsize=2)
def _encoder(tokenizer_dir: str):
    """(fast encoder, eos id, vocabulary size) of a tokenizer directory, once per process."""
    tok = load_tokenizer(Path(tokenizer_dir))
    return encoder_for(tok), tok.eos_token_id, len(tok)


def write_unit(unit: WorkUnit, drops: list[int], tokenizer_dir: str, validation_fraction: float, seed: int,
               out: str, work: str) -> dict:
    """Tokenize a unit's kept documents (scanned, not in `drops`) into its train and val shards; its record.

    Validation documents are those whose text hash (shards.stable_fraction) is below the fraction, so
    the split depends on the text only; train documents are written in a permutation seeded by the
    recipe seed, the source and the unit. An empty split writes no files (megatron-core cannot map an
    empty .bin)."""
    record_path = Path(work) / "done" / f"{unit.name}.json"
    if (done := _done(record_path)) is not None:
        return done
    encoder, eos, vocab = _encoder(tokenizer_dir)
    dtype = indexed_dtype(vocab)
    keep = np.setdiff1d(np.sort(np.asarray(_hashes(work, unit.id)["ord"])), np.asarray(drops, dtype=np.uint32))
    wanted = set(keep.tolist())
    texts = (text for ordinal, text in UnitReader(unit) if ordinal in wanted)
    train, val = [], []
    for batch in batched(texts, ENCODE_BATCH):
        for text, enc in zip(batch, encoder.encode_batch_fast(batch, add_special_tokens=False)):
            ids = np.empty(len(enc.ids) + 1, dtype=dtype)
            ids[:-1], ids[-1] = enc.ids, eos
            (val if stable_fraction(text) < validation_fraction else train).append(ids)
    order = np.random.default_rng(stable_int(f"{seed}:{unit.source}:{unit.id}")).permutation(len(train))
    record = {"unit": unit.id, "source": unit.source, "kept": len(train) + len(val),
              "train": _write_split([train[i] for i in order], dtype, Path(out), unit, "train"),
              "val": _write_split(val, dtype, Path(out), unit, "val")}
    write_file(record_path, json.dumps(record, sort_keys=True).encode())
    return record


def _write_split(docs: list[np.ndarray], dtype: np.dtype, out: Path, unit: WorkUnit, split: str) -> dict | None:
    """`<out>/shards/<source>/<split>/<part>.bin|.idx`, or None for no documents."""
    if not docs:
        return None
    prefix = Path("shards") / unit.source / split / unit.name
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    write_file(out / prefix.with_name(prefix.name + ".bin"), np.concatenate(docs).astype(dtype.newbyteorder("<")).tobytes())
    write_file(out / prefix.with_name(prefix.name + ".idx"), index_bytes(offsets, dtype))
    return {"prefix": prefix.as_posix(), "docs": len(docs), "tokens": int(offsets[-1])}
