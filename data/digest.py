"""Content digests for prepared data: the output path is a hash of everything that shapes it.

Marin's rule: re-running with the same inputs does nothing, and any change to an input
gives a new directory. An input is the bytes of every source file, the source and
tokenizer settings that change the tokens, the world settings and seed, the tokenizers
library version and `FORMAT_VERSION`. Fields that do not change the prepared bytes
(a source's `quality` and `max_epochs`, read by blends and the loader) are left out, so
editing them does not re-tokenize.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tokenizers

from stagewise.data.config import DataConfig, SourceConfig, TokenizerConfig
from stagewise.data.row_files import row_files
from stagewise.data.sources import source_files, source_root
from stagewise.data.tokenizer import existing_tokenizer_dir
from stagewise.data.world import WORLD_VERSION

FORMAT_VERSION = 1
"""Bump when the shard/manifest layout or the way tokenizers and shards are built changes, so
old prepared directories are not reused."""
SOURCE_FIELDS = {"name", "path", "format", "text_field"}


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def files_digest(files: list[Path], root: Path) -> list[list[str]]:
    """[[name relative to root (or the file name when root is the file), sha256], ...]."""
    return [[f.name if f == root else f.relative_to(root).as_posix(), file_sha256(f)] for f in files]


def rows_digest(path: Path, split: str | None = None) -> str:
    """sha256 of what a row source reads (data/row_files.py): a file's bytes, or for a directory
    the names and sha256 of the files of its split (how a stage's step hashes a directory source)."""
    path = Path(path)
    files = [f.path for f in row_files(path, split)]
    return file_sha256(path) if path.is_file() else digest_of(files_digest(files, path))


def source_inputs(src: SourceConfig, base_dir: Path, world_dir: Path | None) -> dict:
    root = source_root(src, base_dir, world_dir)
    return {"config": src.model_dump(include=SOURCE_FIELDS),
            "files": files_digest(source_files(src, base_dir, world_dir), root)}


def tokenizer_inputs(cfg: TokenizerConfig, base_dir: Path) -> dict:
    # how chats are written (reasoning_switch) is not how text is tokenized: not a prepare input
    out: dict = {"config": cfg.model_dump(exclude={"reasoning_switch"}), "tokenizers": tokenizers.__version__}
    if cfg.path is not None:
        root = existing_tokenizer_dir(cfg, base_dir)
        out["files"] = files_digest(sorted(p for p in root.rglob("*") if p.is_file()), root)
    return out


def prepare_inputs(data: DataConfig, tok: TokenizerConfig, seed: int, base_dir: Path,
                   world_dir: Path | None) -> dict:
    """The JSON description of every input of prepare_data (hashed by `digest_of`)."""
    return {
        "format_version": FORMAT_VERSION,
        "seed": seed,
        "validation_fraction": data.validation_fraction,
        "world": None if data.world is None else {**data.world.model_dump(), "version": WORLD_VERSION},
        "tokenizer": tokenizer_inputs(tok, base_dir),
        "sources": [source_inputs(s, base_dir, world_dir) for s in data.sources],
    }


def digest_of(obj: object) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
