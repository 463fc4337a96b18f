"""Real text found on the machine: the Python standard library's docstrings and source.

The demo world needs some natural-ish text that is not synthetic; the stdlib is on every
machine that runs us. Files are listed in sorted order (test folders, data tables and huge
files skipped), a seeded sample of them is taken, and each file yields one document of
docstrings plus its source cut into chunks at top-level boundaries (capped per file, so
prepare stays fast).
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
             "encodings", "pydoc_data", "turtledemo", "ensurepip", "lib2to3"}
MAX_FILE_BYTES = 200_000
MAX_SOURCE_CHARS = 12_000
CHUNK_CHARS = 3_000


def stdlib_root() -> Path:
    """Where this interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Candidate `.py` files under the stdlib, sorted by relative path (deterministic)."""
    root = root or stdlib_root()
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith(("config-", ".")))
        for name in filenames:
            path = Path(dirpath) / name
            if name.endswith(".py") and not name.startswith("_sysconfigdata") and path.stat().st_size <= MAX_FILE_BYTES:
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def module_name(path: Path, root: Path) -> str:
    """`email/mime/text.py` -> `email.mime.text`; `json/__init__.py` -> `json`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def docstring_doc(source: str, module: str) -> str | None:
    """The module's docstring and those of its top-level classes and functions, as one text."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    parts = []
    if doc := ast.get_docstring(tree):
        parts.append(f"Module {module}\n\n{doc}")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if doc := ast.get_docstring(node):
                parts.append(f"{module}.{node.name}\n\n{doc}")
    return "\n\n".join(parts) or None


def source_chunks(source: str) -> list[str]:
    """The first MAX_SOURCE_CHARS of the source, cut at blank lines before top-level code."""
    lines = source[:MAX_SOURCE_CHARS].splitlines(keepends=True)
    chunks, current = [], ""
    for i, line in enumerate(lines):
        boundary = i > 0 and lines[i - 1].strip() == "" and line[:1] not in ("", " ", "\t", "\n")
        if boundary and len(current) >= CHUNK_CHARS:
            chunks.append(current)
            current = ""
        current += line
    if current.strip():
        chunks.append(current)
    return [c.strip("\n") for c in chunks if c.strip()]


def stdlib_texts(n_files: int, rng: random.Random, root: Path | None = None) -> Iterator[str]:
    """Documents from a seeded sample of `n_files` stdlib files, in sorted file order."""
    root = root or stdlib_root()
    files = stdlib_files(root)
    picked = sorted(rng.sample(range(len(files)), min(n_files, len(files))))
    for i in picked:
        path = files[i]
        try:
            source = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        module = module_name(path, root)
        if doc := docstring_doc(source, module):
            yield doc
        for chunk in source_chunks(source):
            yield f"# {module}\n{chunk}"
