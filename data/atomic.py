"""Atomic writes: a directory built in a temporary sibling, or a file under a temporary name, then renamed.

A crash (or a concurrent writer) must never leave a half-written directory under its final
name, because a final name means "complete" to everyone who reads it (prepare reuses
directories by name).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def building(final: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `final`; on success it is renamed to `final`.

    With overwrite=False an existing `final` wins (a concurrent builder got there first) and
    the temporary is discarded; with overwrite=True it is replaced. On error the temporary
    is removed and the error propagates.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o755)
    try:
        yield tmp
        if overwrite and final.exists():
            shutil.rmtree(final)
        try:
            os.replace(tmp, final)
        except OSError:
            if overwrite or not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_file(path: Path, data: bytes) -> None:
    """Write a file under a temporary name, fsync, rename into place: a reader sees all of it or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
