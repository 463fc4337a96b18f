"""Streaming checkpoint merge: θ̂ = Σ cⱼ θⱼ computed tensor by tensor, never N whole models.

    merge_checkpoints([ckpt_a, ckpt_b, ckpt_c], merge_coefficients(3), "merged/", "minus-sqrt")

Why streaming: the inputs of a Super-sized window are terabytes. For each tensor name, the
inputs' tensors are read one after another (model/merge/reader.py: the offsets from the
safetensors headers, the bytes into one reused buffer) and added into one fp32
accumulator, which is cast back to the inputs' dtype and appended to the output file at
once (model/merge/st_writer.py). Peak memory is about one fp32 accumulator + one input
tensor + one output tensor (the largest tensor's), whatever N is.

Rules (ALGORITHMS.md §2): accumulate in fp32; write in the inputs' dtype; non-float
tensors (integers, bools, FP8 codes) must be equal across inputs and are copied, else the
merge is refused; checkpoints whose config.json or tensor names/shapes/dtypes differ are
refused with the first mismatch named (model/merge/layout.py). The output mirrors the
first input's file layout (one file, or the same shards with an index).

The output is a normal checkpoint: config.json, weights, tokenizer and other files copied
from the newest input, `stagewise.json` (stage "merge", step/tokens_seen of the newest
input, parent = the newest input) and `merge_manifest.json` (inputs with their weight
sha256 and tokens_seen, coefficients, schedule, ordering). It is written like every
checkpoint (model/checkpoint.py): into a temporary sibling, fsynced, then renamed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from stagewise.model.checkpoint import META_FILE, CheckpointMeta, atomic_dir, weights_sha256
from stagewise.model.merge.errors import MergeInputError
from stagewise.model.merge.layout import INDEX, WeightLayout, check_compatible
from stagewise.model.merge.reader import TensorReader
from stagewise.model.merge.st_writer import FLOAT_DTYPES, TORCH_DTYPES, StreamingSafetensorsWriter

MANIFEST = "merge_manifest.json"
MANIFEST_FORMAT = 1
_NOT_COPIED = {INDEX, META_FILE, MANIFEST}


def merge_checkpoints(
    paths: Sequence[str | os.PathLike],
    coefficients: Sequence[float],
    out_dir: str | os.PathLike,
    schedule: str,
    *,
    ordering: str = "sequential",
    seed: int | None = None,
    window_tokens: int | None = None,
    recipe_hash: str | None = None,
    verify_inputs: bool = False,
) -> Path:
    """Merge `paths` (oldest first) with `coefficients` into the checkpoint `out_dir`; returns it.

    `schedule`, `ordering`, `seed` and `window_tokens` are recorded in the manifest (the
    coefficients are what is applied). The manifest's input sha256 is the weight_sha256 the
    input's stagewise.json recorded when it was written (inputs without one are hashed);
    `verify_inputs` re-hashes every input and refuses one whose bytes no longer match (a
    corrupt copy). Off by default: hashing reads every input once more, which cost 2-3x the
    merge itself in benchmarks/merge.py, and the pipeline merges each checkpoint in several
    windows.
    Raises MergeInputError on bad input.
    """
    paths = [Path(p) for p in paths]
    coeffs = _check_coefficients(paths, coefficients)
    out = Path(out_dir)
    resolved = [p.resolve() for p in paths]
    if out.resolve() in resolved:
        raise MergeInputError(f"the output {out} is one of the inputs")
    if len(set(resolved)) != len(resolved):
        raise MergeInputError(f"a checkpoint is given twice: {[str(p) for p in paths]}")
    layouts = check_compatible(paths)
    docs = [_stagewise_doc(p) for p in paths]
    newest = max(range(len(paths)), key=lambda i: (docs[i].get("tokens_seen", -1), i))
    # Hashing the inputs reads every byte once more: it runs in threads (hashlib releases the
    # GIL) while the merge reads and adds, instead of before it.
    pool = ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1, 4))
    try:
        hashes = [pool.submit(weights_sha256, p) if verify_inputs or not d.get("weight_sha256") else None
                  for p, d in zip(paths, docs)]
        with atomic_dir(out) as tmp:
            weight_sha = _write_weights(layouts, coeffs, tmp)
            inputs = [_input_record(p, d, c, h.result() if h else d["weight_sha256"])
                      for p, d, c, h in zip(paths, docs, coeffs, hashes)]
            _copy_other_files(paths[newest], tmp)
            meta = _meta(paths[newest], docs[newest], recipe_hash, schedule, ordering, len(paths), window_tokens)
            doc = asdict(meta) | {"weight_sha256": weight_sha}
            (tmp / META_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True))
            manifest = {
                "format": MANIFEST_FORMAT, "schedule": schedule, "ordering": ordering, "seed": seed,
                "window_tokens": window_tokens, "coefficients": coeffs, "inputs": inputs,
                "output": {"tokens_seen": meta.tokens_seen, "parent": meta.parent, "weight_sha256": weight_sha},
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on error, do not hash what is left
    return out


def _check_coefficients(paths: list[Path], coefficients: Sequence[float]) -> list[float]:
    coeffs = [float(c) for c in coefficients]
    if not paths:
        raise MergeInputError("no checkpoints to merge")
    if len(coeffs) != len(paths):
        raise MergeInputError(f"{len(paths)} checkpoints but {len(coeffs)} coefficients")
    if not all(math.isfinite(c) for c in coeffs) or abs(sum(coeffs) - 1.0) > 1e-6:
        raise MergeInputError(f"coefficients must be finite and sum to 1, got {coeffs} (sum {sum(coeffs)})")
    return coeffs


def _stagewise_doc(ckpt: Path) -> dict[str, Any]:
    """stagewise.json as a dict ({} for a plain Hugging Face checkpoint)."""
    path = ckpt / META_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _input_record(ckpt: Path, doc: dict, coeff: float, sha: str) -> dict[str, Any]:
    """The manifest entry of one input; refuses weights that differ from what stagewise.json recorded."""
    recorded = doc.get("weight_sha256")
    if recorded is not None and recorded != sha:
        raise MergeInputError(f"{ckpt}: weights sha256 {sha[:12]}… differs from the {recorded[:12]}… "
                              f"its {META_FILE} records (modified or corrupt)")
    return {"path": str(ckpt.resolve()), "step": doc.get("step"), "tokens_seen": doc.get("tokens_seen"),
            "sha256": sha, "coefficient": coeff}


def _meta(newest: Path, doc: dict, recipe_hash: str | None, schedule: str, ordering: str, n: int,
          window_tokens: int | None) -> CheckpointMeta:
    extra: dict[str, Any] = {"merge": {"schedule": schedule, "ordering": ordering, "n": n,
                                       "window_tokens": window_tokens, "manifest": MANIFEST}}
    mtp = doc.get("mtp") or (doc.get("extra") or {}).get("mtp")
    if mtp:
        extra["mtp"] = mtp  # load_model re-attaches the merged MTP heads from these settings
    return CheckpointMeta(stage="merge", step=int(doc.get("step", 0)), tokens_seen=int(doc.get("tokens_seen", 0)),
                          recipe_hash=recipe_hash or doc.get("recipe_hash", ""), parent=str(newest.resolve()),
                          extra=extra)


def _copy_other_files(src: Path, dest: Path) -> None:
    """config.json, generation config, tokenizer files, ...: every top-level file but weights and stagewise's own."""
    for f in sorted(src.iterdir()):
        if f.is_file() and f.suffix != ".safetensors" and f.name not in _NOT_COPIED:
            shutil.copy2(f, dest / f.name)


# --------------------------------------------------------------------------- the merge itself


def merge_tensor(name: str, dtype: str, read, coeffs: list[float], roots: list[Path],
                 acc: torch.Tensor | None = None) -> torch.Tensor:
    """Σ cᵢ tᵢ in fp32, cast to `dtype`; non-float tensors must be equal (copied) or MergeInputError.

    `read(i)` returns input i's tensor (it may reuse one buffer: only one is used at a time).
    `acc`, when given, is an fp32 buffer of the tensor's shape to accumulate into.
    """
    if dtype not in FLOAT_DTYPES:
        first = read(0).clone()
        for i in range(1, len(coeffs)):
            if not torch.equal(first, read(i)):
                raise MergeInputError(f"non-float tensor {name} ({dtype}) differs between {roots[0]} and {roots[i]}; "
                                      "it cannot be averaged, refusing to merge")
        return first
    started = False
    for i, c in enumerate(coeffs):
        if c == 0.0:
            continue
        t = read(i)
        if acc is None:
            acc = torch.empty(t.shape, dtype=torch.float32)
        if not started:
            acc.copy_(t).mul_(c)  # upcast exactly, then scale in fp32
            started = True
        else:
            acc.add_(t, alpha=c)
    return acc.to(TORCH_DTYPES[dtype])


def _write_weights(layouts: list[WeightLayout], coeffs: list[float], out: Path) -> str:
    """One output file per file of the first input, each streamed tensor by tensor; returns
    the weights' sha256 by model/checkpoint.py's rule (hashed while writing).

    Memory: one read buffer (the largest tensor's bytes) and one fp32 accumulator (the
    largest tensor's elements), reused for every tensor, plus the cast to the output dtype.
    """
    ref = layouts[0]
    largest = max(ref.tensors.values(), key=lambda t: t.nbytes, default=None)
    reader = TensorReader(largest.nbytes if largest else 0)
    acc_buf = torch.empty(max((math.prod(t.shape) for t in ref.tensors.values()), default=1), dtype=torch.float32)
    roots, total, shas = [lay.root for lay in layouts], 0, {}
    try:
        for file in ref.files:
            entries = {n: ref.tensors[n].key for n in ref.names_in(file)}
            writer = StreamingSafetensorsWriter(out / file, entries, ref.metadata or {"format": "pt"})
            try:
                for name in writer.order:
                    dtype, shape = entries[name]
                    acc = acc_buf[: math.prod(shape)].view(shape)

                    def read(i: int, name: str = name) -> torch.Tensor:
                        info = layouts[i].tensors[name]
                        return reader.read(layouts[i].root / info.file, info)

                    writer.write(name, merge_tensor(name, dtype, read, coeffs, roots, acc))
                writer.close()
                total += writer.total_bytes
                shas[file] = writer.sha256
            except BaseException:
                writer.abort()
                raise
    finally:
        reader.close()
    if ref.sharded:
        index = json.loads((ref.root / INDEX).read_text())
        index["weight_map"] = {n: t.file for n, t in sorted(ref.tensors.items())}
        index.setdefault("metadata", {})["total_size"] = total  # bytes of tensor data, as transformers writes it
        (out / INDEX).write_text(json.dumps(index, indent=2))
    return weights_sha256_of(shas)


def weights_sha256_of(file_shas: dict[str, str]) -> str:
    """model/checkpoint.py's weights_sha256 from per-file hashes: the file's own for one file,
    else the sha256 of "<file name> <file sha256>\\n" lines sorted by name."""
    if len(file_shas) == 1:
        return next(iter(file_shas.values()))
    lines = "".join(f"{name} {sha}\n" for name, sha in sorted(file_shas.items()))
    return hashlib.sha256(lines.encode()).hexdigest()
