"""prepare_data: demo world -> tokenizer -> shards -> manifest, in a content-addressed directory.

    prepared = prepare_data(recipe.data, recipe.tokenizer, workdir, seed, base_dir)

The output lives in `<workdir>/data/<digest[:16]>/` (see data/digest.py for what the
digest covers): `tokenizer/` (HF format), `shards/<source>/{train,val}/` and
`manifest.json`. It is built in a temporary sibling and renamed into place, so a crash
never leaves a half directory under a final name, and a second call with the same inputs
only hashes them and returns the existing directory (`reused=True`). The demo world is
cached the same way under `<workdir>/world/<key>/`.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from rich.console import Console

from stagewise.data.atomic import building
from stagewise.data.config import DataConfig, TokenizerConfig, WorldConfig
from stagewise.data.digest import FORMAT_VERSION, digest_of, prepare_inputs
from stagewise.data.shards import SourceShards, write_source_shards
from stagewise.data.sources import iter_texts
from stagewise.data.tokenizer import build_tokenizer, load_tokenizer
from stagewise.data.world import WORLD_VERSION, generate_world

MANIFEST = "manifest.json"

__all__ = ["PreparedData", "SourceShards", "ensure_world", "find_prepared", "prepare_data", "world_path"]


@dataclass(frozen=True)
class PreparedData:
    """A prepared data directory: tokenizer, per-source shards and how they were made."""

    root: Path
    tokenizer_dir: Path
    digest: str
    reused: bool
    sources: dict[str, SourceShards]
    vocab_size: int = 0
    world_dir: Path | None = None

    @classmethod
    def load(cls, root: Path) -> "PreparedData":
        """Read `root/manifest.json` (paths in it are relative to root)."""
        root = Path(root)
        if not (root / MANIFEST).is_file():
            raise FileNotFoundError(f"{root} is not a prepared data directory (no {MANIFEST})")
        m = json.loads((root / MANIFEST).read_text())
        sources = {name: SourceShards(root / s["train"], root / s["val"], s["train_tokens"], s["val_tokens"], s["docs"],
                                      s.get("bad_lines", 0))
                   for name, s in m["sources"].items()}
        world = Path(m["world_dir"]) if m.get("world_dir") else None
        return cls(root, root / m["tokenizer_dir"], m["digest"], True, sources, m["vocab_size"], world)


def world_path(cfg: WorldConfig, seed: int, workdir: Path) -> Path:
    """Where the demo world of (config, seed, generator version, interpreter) lives: `<workdir>/world/<key>`."""
    return Path(workdir) / "world" / digest_of([cfg.model_dump(), seed, WORLD_VERSION, sys.version])[:16]


def ensure_world(cfg: WorldConfig, seed: int, workdir: Path) -> Path:
    """Generate the demo world once per (config, seed, generator version, interpreter)."""
    out = world_path(cfg, seed, workdir)
    if not out.is_dir():
        with building(out) as tmp:
            generate_world(cfg, tmp, seed)
    return out


def prepare_data(data: DataConfig, tokenizer: TokenizerConfig, workdir: Path, seed: int, base_dir: Path,
                 progress: bool = True) -> PreparedData:
    """Build (or reuse) the prepared data for these inputs; see the module docstring."""
    workdir, base_dir = Path(workdir), Path(base_dir)
    world_dir = None
    if data.world is not None:
        with _status("generating the demo world", progress):
            world_dir = ensure_world(data.world, seed, workdir)
    inputs = prepare_inputs(data, tokenizer, seed, base_dir, world_dir)
    digest = digest_of(inputs)
    root = workdir / "data" / digest[:16]
    if (root / MANIFEST).is_file():
        return PreparedData.load(root)
    with building(root) as tmp:
        _build(tmp, data, tokenizer, inputs, digest, seed, base_dir, world_dir, progress)
    return replace(PreparedData.load(root), reused=False)


def find_prepared(data: DataConfig, tokenizer: TokenizerConfig, workdir: Path, seed: int,
                  base_dir: Path) -> PreparedData | None:
    """The prepared data of these inputs if `prepare_data` has built it, else None (nothing is
    generated: without its demo world there can be no prepared data)."""
    world_dir = world_path(data.world, seed, workdir) if data.world is not None else None
    if world_dir is not None and not world_dir.is_dir():
        return None
    root = Path(workdir) / "data" / digest_of(prepare_inputs(data, tokenizer, seed, Path(base_dir), world_dir))[:16]
    return PreparedData.load(root) if (root / MANIFEST).is_file() else None


def _build(tmp: Path, data: DataConfig, tok_cfg: TokenizerConfig, inputs: dict, digest: str, seed: int,
           base_dir: Path, world_dir: Path | None, progress: bool) -> None:
    corpus = {s.name: partial(iter_texts, s, base_dir, world_dir) for s in data.sources}
    with _status("training the tokenizer" if tok_cfg.path is None else "copying the tokenizer", progress):
        tok = load_tokenizer(build_tokenizer(tok_cfg, corpus, base_dir, tmp / "tokenizer"))
    sources, bad_lines = {}, {}
    for src in data.sources:
        texts = iter_texts(src, base_dir, world_dir, bad_lines)  # counted once, on the pass that writes shards
        shards = write_source_shards(texts, tok, tmp / "shards" / src.name, data.validation_fraction, seed, src.name,
                                     progress)
        sources[src.name] = {"train": f"shards/{src.name}/train", "val": f"shards/{src.name}/val",
                             "train_tokens": shards.train_tokens, "val_tokens": shards.val_tokens,
                             "docs": shards.docs, "bad_lines": bad_lines.get(src.name, 0)}
    manifest = {"format_version": FORMAT_VERSION, "digest": digest, "tokenizer_dir": "tokenizer",
                "vocab_size": len(tok), "eos_id": tok.eos_token_id, "bos_id": tok.bos_token_id,
                "pad_id": tok.pad_token_id, "world_dir": str(world_dir) if world_dir else None,
                "sources": sources, "inputs": inputs}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _status(message: str, enabled: bool):
    """A rich spinner while a step without its own progress bar runs (or nothing)."""
    if not enabled:
        return nullcontext()

    return Console(stderr=True).status(message)
