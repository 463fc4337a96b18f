"""Tokenized shards: one memory-mapped token file per split of a source, plus its index.

A shard directory holds `tokens.bin` (raw uint16, or uint32 when the vocabulary does not
fit), `doc_offsets.npy` (int64, n_docs + 1 boundaries: document i is
tokens[offsets[i]:offsets[i+1]], ending with eos) and `meta.json`. The loader reads it with
a sequential cursor, so documents are shuffled (seeded) before writing; validation
documents are chosen by a stable hash of their text, so the split never depends on the
seed or on file order, and duplicates never straddle it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Tokenizer

from stagewise.data.atomic import building

SHARD_FORMAT = 1
TOKENS, OFFSETS, META = "tokens.bin", "doc_offsets.npy", "meta.json"
ENCODE_BATCH = 512


@dataclass(frozen=True)
class TokenShard:
    """An opened shard: `tokens` is a read-only memmap, `doc_offsets` the n_docs + 1 boundaries."""

    path: Path
    tokens: np.ndarray
    doc_offsets: np.ndarray
    meta: dict

    @classmethod
    def open(cls, path: Path) -> "TokenShard":
        path = Path(path)
        meta = json.loads((path / META).read_text())
        dtype = np.dtype(meta["dtype"])
        if meta["n_tokens"] == 0:  # mmap refuses empty files
            tokens = np.zeros(0, dtype=dtype)
        else:
            tokens = np.memmap(path / TOKENS, dtype=dtype, mode="r", shape=(meta["n_tokens"],))
        return cls(path, tokens, np.load(path / OFFSETS), meta)

    @property
    def n_tokens(self) -> int:
        return int(self.meta["n_tokens"])

    @property
    def n_docs(self) -> int:
        return int(self.meta["n_docs"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def doc(self, i: int) -> np.ndarray:
        """The tokens of document i (eos included)."""
        return self.tokens[self.doc_offsets[i]: self.doc_offsets[i + 1]]


@dataclass(frozen=True)
class SourceShards:
    """A source's train and val shard directories and their sizes (`docs` counts both splits)."""

    train: Path
    val: Path
    train_tokens: int
    val_tokens: int
    docs: int
    bad_lines: int = 0
    """Lines dropped under the source's `on_bad_line: skip` (0 when it errors on them)."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def stable_fraction(text: str) -> float:
    """A number in [0, 1) from the sha256 of the text: the same on every machine and run."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64


def stable_int(key: str) -> int:
    """A non-negative 63-bit integer from a string (for seeding numpy generators)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") >> 1


def write_shard(out_dir: Path, docs: Iterable[np.ndarray], vocab_size: int, eos_id: int) -> TokenShard:
    """Write documents (each already ending with eos) as a shard, atomically (replacing out_dir)."""
    dtype = token_dtype(vocab_size)
    offsets = [0]
    with building(out_dir, overwrite=True) as tmp:
        with open(tmp / TOKENS, "wb") as f:
            for doc in docs:
                f.write(np.asarray(doc, dtype=dtype).tobytes())
                offsets.append(offsets[-1] + len(doc))
            f.flush()
            os.fsync(f.fileno())
        np.save(tmp / OFFSETS, np.asarray(offsets, dtype=np.int64))
        meta = {"format": SHARD_FORMAT, "dtype": dtype.name, "n_tokens": offsets[-1], "n_docs": len(offsets) - 1,
                "vocab_size": vocab_size, "eos_id": eos_id}
        (tmp / META).write_text(json.dumps(meta, indent=1))
    return TokenShard.open(out_dir)


def encoder_for(tokenizer) -> Tokenizer:
    """A copy of the fast backend that treats special-token strings inside documents as text."""
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = True
    return backend


def batched(texts: Iterable[str], n: int) -> Iterator[list[str]]:
    """Lists of up to n texts."""
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def encode_documents(texts: Iterable[str], tokenizer, dtype: np.dtype) -> Iterator[tuple[float, np.ndarray]]:
    """(stable_fraction(text), ids + [eos]) per text, encoded in batches (the backend runs them in parallel)."""
    encoder, eos = encoder_for(tokenizer), tokenizer.eos_token_id
    for batch in batched(texts, ENCODE_BATCH):
        for text, enc in zip(batch, encoder.encode_batch_fast(batch, add_special_tokens=False)):
            ids = np.empty(len(enc.ids) + 1, dtype=dtype)
            ids[:-1], ids[-1] = enc.ids, eos
            yield stable_fraction(text), ids


def split_docs(fractions: np.ndarray, validation_fraction: float) -> np.ndarray:
    """Boolean val mask: fraction < validation_fraction, with at least one val document when
    there are two or more (the lowest hash) and always at least one train document (the highest)."""
    val = fractions < validation_fraction
    n = len(fractions)
    if validation_fraction > 0 and n >= 2 and not val.any():
        val[np.argmin(fractions)] = True
    if n >= 1 and val.all():
        val[np.argmax(fractions)] = False
    return val


def write_source_shards(texts: Iterable[str], tokenizer, out_dir: Path, validation_fraction: float,
                        seed: int, name: str = "", progress: bool = False) -> SourceShards:
    """Tokenize a source into out_dir/train and out_dir/val (atomically, via a temp sibling).

    Documents are first streamed into a flat staging file, then the val ones (by text hash)
    are copied in file order to val/ and the train ones in a seeded shuffled order to train/.
    """
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    with building(out_dir, overwrite=True) as tmp:
        staged, offsets, fractions = _stage(texts, tokenizer, tmp / "staged.bin", token_dtype(vocab), name, progress)
        if len(fractions) == 0:
            raise ValueError(f"source {name!r} has no documents")
        val = split_docs(fractions, validation_fraction)
        rng = np.random.default_rng(stable_int(f"{seed}:{name}"))
        train_order = rng.permutation(np.flatnonzero(~val))
        docs = lambda idx: (staged[offsets[i]: offsets[i + 1]] for i in idx)  # noqa: E731
        train = write_shard(tmp / "train", docs(train_order), vocab, eos)
        valid = write_shard(tmp / "val", docs(np.flatnonzero(val)), vocab, eos)
        (tmp / "staged.bin").unlink()
    out_dir = Path(out_dir)
    return SourceShards(out_dir / "train", out_dir / "val", train.n_tokens, valid.n_tokens, len(fractions))


def _stage(texts, tokenizer, path: Path, dtype: np.dtype, name: str, progress: bool):
    """Encode every text into one flat file; returns (memmap, offsets, hash fractions)."""
    offsets, fractions = [0], []
    with open(path, "wb") as f, _progress(name, progress) as advance:
        for frac, ids in encode_documents(texts, tokenizer, dtype):
            f.write(ids.tobytes())
            offsets.append(offsets[-1] + len(ids))
            fractions.append(frac)
            advance(len(ids))
    staged = np.memmap(path, dtype=dtype, mode="r") if offsets[-1] else np.zeros(0, dtype)
    return staged, np.asarray(offsets, dtype=np.int64), np.asarray(fractions)


@contextmanager
def _progress(name: str, enabled: bool):
    """Yields advance(n_tokens): a rich progress line per source (documents and tokens), or a no-op."""
    if not enabled:
        yield lambda n: None
        return

    columns = [TextColumn("tokenizing {task.description}"), BarColumn(),
               TextColumn("{task.fields[docs]:,} docs, {task.completed:,.0f} tokens"), TimeElapsedColumn()]
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(name, total=None, docs=0)
        counts = {"docs": 0}

        def advance(n: int) -> None:
            counts["docs"] += 1
            bar.update(task, advance=n, docs=counts["docs"])

        yield advance
