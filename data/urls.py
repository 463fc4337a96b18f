"""Sources named by URL (`s3://bucket/web/part-*.jsonl`, `https://host/corpus/a.parquet`), read through fsspec.

Only the corpus build (`stagewise data build`, data/corpus/) reads them: its plan lists each file's URL
and size, and every worker, in this process or on a Ray node, opens the same URL again, so nothing is
copied to the driver first. The filesystem library of a protocol (s3fs, gcsfs, adlfs; aiohttp for http)
must be installed where the build and its workers run, and its credentials come the way that library
takes them (environment, config files), never from the recipe. The URL goes to fsspec as it is, never to
a shell. A protocol fsspec does not know, or whose library is missing, is refused before any work (exit 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from stagewise.data.errors import BadInput
from stagewise.data.sources import is_glob, is_url


def url_filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, the path within it) of a URL; BadInput naming the URL when it cannot be read here."""
    import fsspec  # noqa: PLC0415  (only URL sources need it)
    from fsspec.core import url_to_fs  # noqa: PLC0415

    protocol = url.split("://", 1)[0].lower()
    if protocol not in fsspec.available_protocols():
        raise BadInput(f"{url}: fsspec knows no {protocol!r} protocol")
    try:
        return url_to_fs(url)
    except ImportError as e:
        raise BadInput(f"{url}: the {protocol!r} filesystem library is not installed here ({e})") from None
    except ValueError as e:  # a malformed URL for its protocol
        raise BadInput(f"{url}: {e}") from None


def url_files(url: str) -> list[str]:
    """The files a URL names: itself, or a glob's matches as URLs in sorted order; names starting with `.`
    below the glob's first wildcard are skipped, as in a local glob (data/sources.py)."""
    fs, path = url_filesystem(url)
    if not is_glob(path):
        try:
            if fs.isfile(path):
                return [url]
        except OSError as e:
            raise BadInput(f"{url}: cannot be read ({e})") from None
        raise BadInput(f"{url}: no such file (a URL source names a file or a glob of files)")
    try:
        found = sorted(fs.glob(path))
    except OSError as e:
        raise BadInput(f"{url}: cannot list it ({e})") from None
    root = path.split("/")
    depth = next(i for i, part in enumerate(root) if is_glob(part))  # parts above the first wildcard
    return [fs.unstrip_protocol(p) if "://" not in p else p for p in found
            if not any(part.startswith(".") for part in p.split("/")[depth:])]


def url_size(url: str) -> int:
    """A file's size in bytes (what the plan cuts JSONL by, and a rerun compares)."""
    fs, path = url_filesystem(url)
    try:
        return int(fs.size(path))
    except (OSError, TypeError) as e:
        raise BadInput(f"{url}: cannot tell its size ({e})") from None


@contextmanager
def native_or_url(file: str) -> Iterator[str | IO[bytes]]:
    """What pyarrow opens: a local path as it is (pyarrow's own reader, no Python file in between on the hot
    path), or a URL's seekable fsspec file, closed afterwards."""
    if not is_url(file):
        yield file
        return
    with open_input(file) as f:
        yield f


def open_input(file: str) -> IO[bytes]:
    """A work unit's input file for reading bytes: a local path, or a URL through fsspec (seekable)."""
    if not is_url(file):
        return open(file, "rb")  # noqa: SIM115  (the caller closes it)
    fs, path = url_filesystem(file)
    return fs.open(path, "rb")
