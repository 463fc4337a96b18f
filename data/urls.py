"""Sources named by URL (`s3://bucket/web/part-*.jsonl`, `https://host/corpus/a.parquet`), read through fsspec.

Only the corpus build (`stagewise data build`, data/corpus/) reads them: its plan lists each file's URL
and size, and every worker, in this process or on a Ray node, opens the same URL again, so nothing is
copied to the driver first. The filesystem library of a protocol (s3fs, gcsfs, adlfs; aiohttp for http)
must be installed where the build and its workers run, and its credentials come the way that library
takes them (environment, config files), never from the recipe. The URL goes to fsspec as it is, never to
a shell. A protocol fsspec does not know, or whose library is missing, is refused before any work (exit 2).
"""

from __future__ import annotations

import re
from typing import IO, Any

from stagewise.data.errors import BadInput

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """A path with a protocol (`s3://...`, `file:///...`): read through fsspec, not as a local path."""
    return bool(_URL.match(path))


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
    """The files a URL names: itself, or a glob's matches as URLs in sorted order (hidden names skipped)."""
    fs, path = url_filesystem(url)
    if not any(c in "*?[" for c in path):
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
    return [fs.unstrip_protocol(p) if "://" not in p else p for p in found
            if not any(part.startswith(".") for part in p.split("/")[-1:])]


def url_size(url: str) -> int:
    """A file's size in bytes (what the plan cuts JSONL by, and a rerun compares)."""
    fs, path = url_filesystem(url)
    try:
        return int(fs.size(path))
    except (OSError, TypeError) as e:
        raise BadInput(f"{url}: cannot tell its size ({e})") from None


def open_input(file: str) -> IO[bytes]:
    """A work unit's input file for reading bytes: a local path, or a URL through fsspec (seekable)."""
    if not is_url(file):
        return open(file, "rb")  # noqa: SIM115  (the caller closes it)
    fs, path = url_filesystem(file)
    return fs.open(path, "rb")
