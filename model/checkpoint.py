"""Checkpoint I/O: a Hugging Face directory plus what it takes to resume training.

Layout (DESIGN.md, Checkpoint):

    <stage_dir>/step-00000120/
        config.json, generation_config.json, model.safetensors   (model.save_pretrained)
        tokenizer files                                          (copied from tokenizer_dir)
        stagewise.json                                           (CheckpointMeta)
        trainer_state/optimizer.pt                               (optimizer.state_dict())
        trainer_state/rng.pt                                     (python/numpy/torch RNG)
        trainer_state/monitors.pt                                (monitor state dicts + Trainer.state_to_save())
        trainer_state/state.json                                 (progress, numerics + data loader)

Why it is written this way:
- Atomic: everything goes into `.tmp-<name>-<pid>` beside the final directory, every file
  and directory is fsynced, then one `os.replace` publishes it. A crash (even SIGKILL)
  leaves at most a dot-directory, which `list_checkpoints` ignores, never a half
  checkpoint under a final name; the next save under that name removes a dead process's
  temp directory. Replacing or deleting a checkpoint renames it away first.
- Safe to load: weights are safetensors; trainer state is read with
  `torch.load(weights_only=True)`, so it holds tensors and plain Python types only (the RNG
  states are converted to lists and tensors for that reason, model/rng.py).
- `weight_sha256` lets a later stage (or a person) check that the weights it loads are the
  ones this run wrote: the sha256 of `model.safetensors`, or, when sharded, the sha256 of
  the lines "<file name> <file sha256>\\n" over all `*.safetensors` files sorted by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import load_file
from transformers.utils import logging as hf_logging

META_FILE = "stagewise.json"
STATE_DIR = "trainer_state"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"


@dataclass(frozen=True)
class CheckpointMeta:
    """What `stagewise.json` says about a checkpoint."""

    stage: str
    step: int
    tokens_seen: int
    recipe_hash: str
    parent: str | None = None
    """The checkpoint this one continues from (the previous save, or the stage's input)."""
    weight_sha256: str | None = None
    """Filled in by save_checkpoint from the written weight files."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form JSON (e.g. MTP settings for load_model, the stop reason)."""


@dataclass
class TrainerState:
    """Everything besides the weights that an exact resume needs."""

    optimizer: dict[str, Any]
    """optimizer.state_dict()."""
    progress: dict[str, Any]
    """JSON: step, tokens_seen (the schedule position: lr is a function of tokens_seen) and the
    numerics it was computed under (model.trainer.numerics: torch build, thread count)."""
    rng: dict[str, Any] = field(default_factory=dict)
    """model.rng.capture_rng() output (tensors and plain types)."""
    loader: dict[str, Any] | None = None
    """The batch source's state_dict() (JSON-able by the loader contract)."""
    monitors: dict[str, Any] = field(default_factory=dict)
    """{monitor name: state_dict()} and a Trainer subclass's `state_to_save()` (e.g. LoRA
    adapters), tensors and plain types."""


# ---------------------------------------------------------------- hashing and fsync


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root, topdown=False):
        for name in files:
            _fsync_file(Path(dirpath) / name)
        _fsync_dir(Path(dirpath))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_sha256(ckpt_dir: str | os.PathLike) -> str:
    """sha256 of the weights (see the module docstring for the sharded rule)."""
    files = sorted(Path(ckpt_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {ckpt_dir}")
    if len(files) == 1:
        return _sha256(files[0])
    lines = "".join(f"{p.name} {_sha256(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


# ---------------------------------------------------------------- save


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(parent: Path, name: str) -> None:
    """Drop `.tmp-<name>-<pid>` left by a process that died mid-save."""
    for tmp in parent.glob(f"{_TMP_PREFIX}{name}-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _quiet_hf():
    """No transformers progress bars ("Writing model shards") inside a training loop."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _copy_tokenizer(tokenizer_dir: Path, dest: Path) -> None:
    """Copy the tokenizer's files; never over a file the model already wrote (config.json), and never
    weights or our metadata: the tokenizer directory may be a checkpoint (a stage's input), whose
    `model.safetensors` beside an export's shards would be a second set of weights."""
    for src in sorted(tokenizer_dir.iterdir()):
        if src.is_file() and not _is_weights(src.name) and src.name != META_FILE and not (dest / src.name).exists():
            shutil.copy2(src, dest / src.name)


def _is_weights(name: str) -> bool:
    return name.endswith((".safetensors", ".safetensors.index.json", ".bin", ".pt"))


def _write_trainer_state(dest: Path, state: TrainerState) -> None:
    dest.mkdir()
    torch.save(state.optimizer, dest / "optimizer.pt")
    torch.save(state.rng, dest / "rng.pt")
    torch.save(state.monitors, dest / "monitors.pt")
    doc = {"progress": state.progress, "loader": state.loader}
    (dest / "state.json").write_text(json.dumps(doc, indent=1))


def _publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; an existing `final` is moved aside first, then deleted."""
    trash = None
    if final.exists():
        trash = final.parent / f"{_TRASH_PREFIX}{final.name}-{os.getpid()}"
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """`with atomic_dir(final) as tmp:` write everything into `tmp`; on success every file is
    fsynced and `tmp` renamed to `final` in one step (an old `final` is replaced), on any
    error `tmp` is removed. A reader therefore sees the old directory or the whole new one,
    never a half-written one, even after SIGKILL (stale temps of dead processes are swept)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(final.parent, final.name)
    tmp = final.parent / f"{_TMP_PREFIX}{final.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_checkpoint(
    dir: str | os.PathLike,
    model: torch.nn.Module,
    tokenizer_dir: str | os.PathLike | None,
    meta: CheckpointMeta,
    trainer_state: TrainerState | None = None,
) -> Path:
    """Write a checkpoint atomically to `dir` and return its path.

    `meta.weight_sha256` is ignored and recomputed from the written files.
    `tokenizer_dir=None` writes no tokenizer (tests, or a tokenizer saved elsewhere).
    """
    final = Path(dir)
    with atomic_dir(final) as tmp:
        with _quiet_hf():
            model.save_pretrained(tmp)
        if tokenizer_dir is not None:
            _copy_tokenizer(Path(tokenizer_dir), tmp)
        if trainer_state is not None:
            _write_trainer_state(tmp / STATE_DIR, trainer_state)
        doc = asdict(meta) | {"weight_sha256": weights_sha256(tmp)}
        (tmp / META_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True))
    return final


def adopt_checkpoint(export_dir: str | os.PathLike, dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None,
                     meta: CheckpointMeta) -> Path:
    """Publish a Hugging Face export another engine wrote (Megatron-Bridge's or NeMo RL's HF export)
    as our checkpoint `dir`: its files copied, the tokenizer added where the export has none, and
    `stagewise.json` written, atomically like save_checkpoint. Refuses an export that is not a
    loadable HF directory (no config.json or no safetensors weights), naming what is missing."""
    src = Path(export_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: the engine's export has no config.json (not a Hugging Face checkpoint)")
    if not list(src.glob("*.safetensors")):
        raise FileNotFoundError(f"{src}: the engine's export has no *.safetensors weights")
    final = Path(dir)
    with atomic_dir(final) as tmp:
        for item in sorted(src.iterdir()):
            if item.is_file() and item.name != META_FILE:
                shutil.copy2(item, tmp / item.name)
        if tokenizer_dir is not None:
            _copy_tokenizer(Path(tokenizer_dir), tmp)
        doc = asdict(meta) | {"weight_sha256": weights_sha256(tmp)}
        (tmp / META_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True))
    return final


# ---------------------------------------------------------------- read


def read_meta(dir: str | os.PathLike) -> CheckpointMeta:
    """The checkpoint's stagewise.json as a CheckpointMeta."""
    doc = json.loads((Path(dir) / META_FILE).read_text())
    return CheckpointMeta(**doc)


def load_trainer_state(dir: str | os.PathLike) -> TrainerState | None:
    """The trainer state of a checkpoint (None if it has none), tensors on the CPU."""
    root = Path(dir) / STATE_DIR
    if not root.is_dir():
        return None

    def load(name: str) -> Any:
        return torch.load(root / name, map_location="cpu", weights_only=True)

    doc = json.loads((root / "state.json").read_text())
    return TrainerState(
        optimizer=load("optimizer.pt"),
        progress=doc["progress"],
        rng=load("rng.pt"),
        loader=doc.get("loader"),
        monitors=load("monitors.pt"),
    )


def load_weights_into(model: torch.nn.Module, dir: str | os.PathLike) -> None:
    """Copy a checkpoint's weights into an existing model in place (the optimizer keeps
    pointing at the same parameters).

    save_pretrained writes the original NemotronH layout (`backbone.*`, one tensor per
    expert); transformers' from_pretrained knows the conversion back, so the base model is
    loaded through it. Tensors that from_pretrained ignores (`mtp.*` heads) are read from
    the safetensors files directly.
    """
    dtype = next(model.parameters()).dtype
    with _quiet_hf():
        loaded = type(model).from_pretrained(dir, dtype=dtype)
    state = loaded.state_dict()
    del loaded
    own = model.state_dict()
    for path in sorted(Path(dir).glob("*.safetensors")):
        for key, tensor in load_file(path).items():
            if key not in state and key in own:
                state[key] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {dir} does not match the model: missing {missing}, unexpected {unexpected}")


# ---------------------------------------------------------------- list and prune


def list_checkpoints(stage_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under `stage_dir`, oldest (lowest step) first; temp dirs ignored."""
    root = Path(stage_dir)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        if d.is_dir() and not d.name.startswith(".") and (d / META_FILE).is_file():
            found.append((read_meta(d).step, d.name, d))
    return [d for _, _, d in sorted(found)]


def latest_checkpoint(stage_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under `stage_dir`, or None."""
    found = list_checkpoints(stage_dir)
    return found[-1] if found else None


def remove_checkpoint(dir: str | os.PathLike) -> None:
    """Delete a checkpoint so that no half of it ever remains under its name."""
    d = Path(dir)
    trash = d.parent / f"{_TRASH_PREFIX}{d.name}-{os.getpid()}"
    os.replace(d, trash)
    _fsync_dir(d.parent)
    shutil.rmtree(trash, ignore_errors=True)
