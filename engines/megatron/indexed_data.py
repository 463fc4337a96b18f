"""Our tokenized shards as Megatron indexed datasets (`<prefix>.bin` + `<prefix>.idx`), for `engine: megatron`.

Megatron-Bridge pretrains from megatron-core's `IndexedDataset`: a `.bin` of raw tokens and an
`.idx` describing them. Our shards (data/shards.py) already hold the same thing — a flat token
file and document boundaries — so the hand-off writes the tokens once more in Megatron's layout
rather than re-tokenizing (the documents, their order and the eos that ends each stay ours, so
both engines read the same token stream).

The layout and its one writer are data/indexed_format.py's (the corpus build writes it directly).

Each pretraining source becomes one dataset prefix; the blend weights go into Megatron-Bridge's
`blend` (engines/megatron/translate.py). `write_indexed_dir` builds the whole directory
through data.atomic.building (a crash leaves no half dataset under the final name).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stagewise.data.atomic import building
from stagewise.data.indexed_format import index_bytes
from stagewise.data.shards import TokenShard


def write_indexed(shard: TokenShard, prefix: Path) -> Path:
    """Write `shard` as `<prefix>.bin` + `<prefix>.idx`; the prefix (what Megatron's blend names)."""
    prefix = Path(prefix)
    tokens = np.asarray(shard.tokens)
    if tokens.dtype == np.uint32:  # our wide shards (vocabularies over 65,535); Megatron has int32
        tokens = tokens.astype(np.int32)
    prefix.with_name(prefix.name + ".bin").write_bytes(tokens.astype(tokens.dtype.newbyteorder("<")).tobytes())
    prefix.with_name(prefix.name + ".idx").write_bytes(index_bytes(shard.doc_offsets, tokens.dtype))
    return prefix


def write_indexed_dir(shards: dict[str, TokenShard], out_dir: Path) -> dict[str, Path]:
    """Every shard as `<out_dir>/<name>.bin|.idx`, the directory published atomically; name -> prefix.

    An existing complete directory is reused (its name is content-addressed by the caller)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        with building(out_dir) as tmp:
            for name, shard in shards.items():
                write_indexed(shard, tmp / name)
    return {name: out_dir / name for name in shards}
