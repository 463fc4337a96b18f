"""The three steps of a corpus build, each a plain function of one work unit (or one hash partition).

    scan_unit(unit, ...)        read -> filter -> a 128-bit hash of each kept document's normalised text,
                                written to <work>/scan/<part>.npy grouped by hash partition
    find_duplicates(p, ...)     one partition of every unit's hashes: which (unit, ordinal) repeat an
                                earlier document (the shuffle's reduce side)
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
from stagewise.data.corpus.config import FilterConfig
from stagewise.data.corpus.filters import reject_reason
from stagewise.data.corpus.plan import WorkUnit
from stagewise.data.corpus.read import UnitReader
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


def scan_unit(unit: WorkUnit, filters: FilterConfig, partitions: int, work: str) -> dict:
    """Filter a unit's documents and record the kept ones' hashes; the summary (also on disk)."""
    summary_path = Path(work) / "scan" / f"{unit.name}.json"
    if (done := _done(summary_path)) is not None:
        return done
    reader = UnitReader(unit)
    rows, rejected, docs = [], {}, 0
    for ordinal, text in reader:
        docs += 1
        reason = reject_reason(text, filters)
        if reason is not None:
            rejected[reason] = rejected.get(reason, 0) + 1
            continue
        rows.append((*text_hash(text), unit.id, ordinal))
    records = np.array(rows, dtype=HASHES)
    part = (records["h1"] % np.uint64(partitions)).astype(np.int64)
    order = np.argsort(part, kind="stable")
    records = records[order]
    bounds = np.searchsorted(part[order], np.arange(partitions + 1)).tolist()
    write_file(summary_path.with_suffix(".npy"), _npy_bytes(records))
    summary = {"unit": unit.id, "source": unit.source, "docs": docs, "kept": len(records),
               "rejected": dict(sorted(rejected.items())), "bad_lines": reader.bad_lines, "bounds": bounds}
    write_file(summary_path, json.dumps(summary, sort_keys=True).encode())
    return summary


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
    record = {"unit": unit.id, "source": unit.source, "kept": len(train) + len(val), "duplicates": len(drops),
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
