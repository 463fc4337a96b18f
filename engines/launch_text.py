"""The strings a launch may carry: what each recipe field that reaches a script, a manifest or a command
line is allowed to hold, refused at load (exit 2, the field and its line named) otherwise.

A recipe, a `--set` and a Prefect form are hostile input, and these fields end up where text is code:
`#SBATCH` lines (which sbatch parses itself, so no shell quoting helps), pyxis' comma-separated
`--container-mounts`, `docker run` argv (where a leading `-` is an option), Kubernetes names. Quoting
covers the shell lines (engines/launch/plans.py uses shlex everywhere); these types cover the rest by
admitting only what the scheduler's own grammar admits, so a newline, a comma or an option never
slips into a field. Each refusal says what the field may hold and which character broke it.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""Newlines, tabs, NUL and the other control characters: never in a launch string."""


def _first_bad(value: str, allowed: str) -> str:
    """The first character of `value` outside the character class `allowed`, as repr shows it."""
    bad = re.search(f"[^{allowed}]", value)
    return repr(bad.group()) if bad else "its form"


def _checked(what: str, pattern: str, allowed: str, max_len: int):
    """A validator admitting `pattern` (whole string, at most `max_len` characters), naming `what` it wants."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if len(value) > max_len:
            raise ValueError(f"{what}; {len(value)} characters is longer than {max_len}")
        if not compiled.fullmatch(value):
            raise ValueError(f"{what}; {value!r} breaks it at {_first_bad(value, allowed)}")
        return value

    return AfterValidator(check)


def _plain_path(value: str) -> str:
    if not value:
        raise ValueError("an empty path")
    bad = CONTROL.search(value)
    if bad:
        raise ValueError(f"a path without control characters; {value!r} has {bad.group()!r}")
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"an absolute path inside the environment (it is the process's working directory), not {value!r}")
    return value


_WORD = r"A-Za-z0-9_.\-"
SlurmName = Annotated[str, _checked(
    "a Slurm name: letters, digits, '_', '.', '-', starting with a letter or digit",
    r"[A-Za-z0-9][A-Za-z0-9_.\-]*", _WORD, 128)]
"""An account (sbatch --account)."""
SlurmPartitions = Annotated[str, _checked(
    "Slurm partitions: names of letters, digits, '_', '.', '-', several joined by ','",
    r"[A-Za-z0-9][A-Za-z0-9_.\-]*(,[A-Za-z0-9][A-Za-z0-9_.\-]*)*", _WORD + ",", 256)]
"""A partition, or several (sbatch --partition=a,b)."""
SlurmTime = Annotated[str, _checked(
    "a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, UNLIMITED or INFINITE",
    r"\d+(:\d\d){0,2}|\d+-\d+(:\d\d){0,2}|UNLIMITED|INFINITE", r"0-9:\-", 32)]
"""sbatch --time."""
ImageRef = Annotated[str, _checked(
    "a container image: a registry reference (nvcr.io/nvidia/nemo:26.08, an enroot 'host#path', "
    "'@sha256:...') or an absolute .sqsh path; letters, digits and . _ - / : @ # + only, not starting with '-'",
    r"[A-Za-z0-9/][A-Za-z0-9._/:@#+\-]*", r"A-Za-z0-9._/:@#+\-", 512)]
"""docker run's IMAGE, srun's --container-image, a pod's image."""
ContainerMount = Annotated[str, _checked(
    "a container mount 'SRC:DST' or 'SRC:DST:FLAGS': absolute paths without ':', ',' or spaces, "
    "flags letters joined by '+' (ro, rw, ro+rbind)",
    r"/[A-Za-z0-9._/@+=\-]*:/[A-Za-z0-9._/@+=\-]*(:[a-z]+(\+[a-z]+)*)?", r"A-Za-z0-9._/@+=:\-", 1024)]
"""One of pyxis' comma-separated --container-mounts (and a docker -v)."""
KubernetesLabel = Annotated[str, _checked(
    "a Kubernetes name (RFC 1123 label): lower-case letters, digits and '-', starting and ending with a "
    "letter or digit, at most 63 characters",
    r"[a-z0-9]([a-z0-9\-]*[a-z0-9])?", r"a-z0-9\-", 63)]
"""A namespace."""
KubernetesSubdomain = Annotated[str, _checked(
    "a Kubernetes name (RFC 1123 subdomain): lower-case letters, digits, '-' and '.', at most 253 characters",
    r"[a-z0-9]([a-z0-9.\-]*[a-z0-9])?", r"a-z0-9.\-", 253)]
"""A PersistentVolumeClaim's name."""
PlainPath = Annotated[str, AfterValidator(_plain_path)]
"""A path that is quoted where it goes (argv, shlex-quoted script lines, YAML values): only control
characters, which no quoting keeps out of an #SBATCH line or a log, are refused."""
EnvironmentPath = Annotated[str, AfterValidator(_plain_path), AfterValidator(_absolute)]
"""An absolute path inside the engine's environment (its working directory)."""
RecipeName = Annotated[str, _checked(
    "a recipe name: a slug of letters, digits, '_', '.', '-', starting with a letter or digit "
    "(it names the workdir runs/<name> and the MLflow experiment)",
    r"[A-Za-z0-9][A-Za-z0-9_.\-]*", _WORD, 100)]
"""The recipe's `name`: `..` or `a/b` would move its default workdir out of runs/."""

MOUNT_BREAKERS = re.compile(r"[,:\s]")
"""Characters a directory mounted into a container may not have: ':' splits docker's -v and pyxis'
SRC:DST, ',' splits pyxis' mount list, whitespace an #SBATCH line."""
