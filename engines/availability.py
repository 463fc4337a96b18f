"""Is the launched engine a stage asks for there to launch? A clear error before anything starts.

Megatron-Bridge and NeMo RL live in their own GPU environment, so "not installed" is the common
first failure, and it should read as one: which recipe key named the environment, and how to get
the engine there — not a traceback from deep inside torchrun, docker or srun. `check_engine`
checks what can be checked from here without importing anything of the engines:

- a venv: its directory and bin/python exist, its python finds the engine's module (asked in a
  subprocess with importlib.util.find_spec, so the engine is never imported into this process),
  and the launcher it needs is there (bin/torchrun for Megatron-Bridge; bin/ray for NeMo RL on
  Slurm, where the Ray cluster is started by the script). For Megatron-Bridge the same python
  also reads the installed release (`importlib.metadata.version("megatron-bridge")`, else the
  package's own package_info.py), which must be the one the translation is validated against
  (engines/megatron/release.py): another release may build a different config from the same
  overrides. An environment with no version record at all (a bare stand-in package) is let
  through: nothing says it is another release;
- an image: only the scheduler's tool can be checked (the image is pulled where it runs, so its
  Megatron-Bridge release is not read here; docs/DEPLOY.md says which one to use): docker
  or podman for local, sbatch for Slurm (with pyxis for `--container-image`), kubectl for
  Kubernetes. Slurm and Kubernetes need their tool for a venv too (Kubernetes needs an image).

A failure raises EngineMissing (a ValueError: the CLI reports it and exits 2). Command lookups
and the subprocess are parameters, so tests do not depend on what this machine has installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable

from stagewise.engines.config import LaunchConfig
from stagewise.engines.megatron.release import MEGATRON_BRIDGE_RELEASE

ENGINE_MODULES: dict[str, str] = {"megatron": "megatron.bridge", "nemo_rl": "nemo_rl"}
"""The module each launched engine's environment must provide."""

ENGINE_NAMES: dict[str, str] = {"megatron": "Megatron-Bridge", "nemo_rl": "NeMo RL"}

INSTALL_HINTS: dict[str, str] = {
    "megatron": (
        "Megatron-Bridge needs a GPU environment of its own (it pins its own transformers, Transformer Engine "
        "and mamba-ssm, so it cannot share this install): use the NeMo Framework container, "
        "`launch.env.image: nvcr.io/nvidia/nemo:<tag>` "
        "(tags: https://catalog.ngc.nvidia.com/orgs/nvidia/containers/nemo/tags; workdir /opt/Megatron-Bridge), "
        "or make a venv on a CUDA machine: `python -m venv VENV && VENV/bin/pip install torch && "
        f"VENV/bin/pip install --no-build-isolation 'megatron-bridge[te,ssm]=={MEGATRON_BRIDGE_RELEASE}'` "
        "(the release stagewise's plans are validated against: docs/DEPLOY.md, \"Which Megatron-Bridge\")"
    ),
    "nemo_rl": (
        "NeMo RL needs a GPU environment of its own: use its container, "
        "`launch.env.image: nvcr.io/nvidia/nemo-rl:<tag>`, or its uv setup on a CUDA machine: "
        "`git clone --recursive https://github.com/NVIDIA-NeMo/RL nemo-rl && cd nemo-rl && uv venv && uv sync` "
        "(add `--extra mcore` for the Megatron backend), then `launch.env.venv: nemo-rl/.venv` "
        "and `launch.env.workdir: nemo-rl`"
    ),
}
"""How to get each engine, quoted in every EngineMissing about it."""

SCHEDULER_TOOLS: dict[str, tuple[str, ...]] = {"local": ("docker", "podman"), "slurm": ("sbatch",),
                                               "kubernetes": ("kubectl",)}
"""The commands each scheduler needs on PATH (local: any one of them, and only for an image)."""

FIND_SPEC = "import importlib.util,sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
"""Run by the venv's python: exit 1 when the module is not found (0 when it is)."""

RELEASE_OF = ("import importlib.metadata as m,importlib.util,json,sys\n"
              "try:\n    version = m.version(sys.argv[1])\n"
              "except m.PackageNotFoundError:\n    version = None\n"
              "spec = importlib.util.find_spec(sys.argv[2])\n"
              "print(json.dumps({'version': version, 'dirs': list(spec.submodule_search_locations or [])}))\n")
"""Run by the venv's python with (distribution, module): one JSON line, the distribution's installed
version (None without metadata) and the module's package directories (for package_info.py)."""

ENGINE_RELEASES: dict[str, tuple[str, str]] = {"megatron": ("megatron-bridge", MEGATRON_BRIDGE_RELEASE)}
"""The distribution and release each engine's translation is pinned to (NeMo RL: not pinned)."""

Which = Callable[[str], "str | None"]


class EngineMissing(ValueError):
    """The engine (or what launches it) is not where the recipe says; `field` is the recipe key path
    to change (e.g. `stages.pretrain.launch.env.venv`) and the message says how to get it."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def container_tool(which: Which = shutil.which) -> str | None:
    """`docker` or `podman`, whichever is on PATH first in that order; None when neither is."""
    return next((t for t in SCHEDULER_TOOLS["local"] if which(t)), None)


def check_engine(engine: str, launch: LaunchConfig, *, field: str = "launch", which: Which = shutil.which,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run, timeout: float = 120) -> None:
    """Raise EngineMissing unless `engine` can be launched as `launch` says (see the module docstring).

    engine: `megatron` or `nemo_rl`; `torch` (ours) only when the stage runs as a job: its scheduler's tool.
    field: the recipe key path of `launch` (e.g. `stages.pretrain.launch`); errors name a key under it.
    which: looks a command up on PATH (shutil.which). run: runs the venv's python (subprocess.run).
    """
    if engine == "torch":
        _check_scheduler(engine, launch, field, which)
        return
    if engine not in ENGINE_MODULES:
        raise ValueError(f"unknown engine {engine!r}; launched engines: {', '.join(ENGINE_MODULES)}")
    name, hint = ENGINE_NAMES[engine], INSTALL_HINTS[engine]
    _check_scheduler(engine, launch, field, which)
    if launch.env.venv is not None:
        _check_venv(engine, launch, f"{field}.env.venv", run, timeout, name, hint)


def _check_scheduler(engine: str, launch: LaunchConfig, field: str, which: Which) -> None:
    scheduler = launch.scheduler
    if scheduler == "local":
        if launch.env.image is not None and container_tool(which) is None:
            raise EngineMissing(f"{field}.env.image", (
                f"running the image {launch.env.image} here needs docker or podman on PATH, and neither is: "
                "install one with the NVIDIA Container Toolkit "
                "(https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/), "
                f"or give `env.venv` instead. {INSTALL_HINTS.get(engine, '')}"))
        return
    if scheduler == "slurm":
        if which("sbatch") is None:
            pyxis = (" For `env.image` the cluster also needs the pyxis/enroot plugin (srun --container-image)."
                     if launch.env.image is not None else "")
            raise EngineMissing(f"{field}.scheduler", (
                "scheduler slurm submits with sbatch, which is not on PATH: run this on a Slurm login node "
                f"(or use scheduler local on a GPU machine).{pyxis}"))
        return
    if launch.env.image is None:
        raise EngineMissing(f"{field}.env.venv", "scheduler kubernetes runs containers: give `env.image`, not a venv. "
                            + INSTALL_HINTS.get(engine, ""))
    if which("kubectl") is None:
        raise EngineMissing(f"{field}.scheduler", (
            "scheduler kubernetes applies a Job with kubectl, which is not on PATH: install kubectl and point it "
            "at the cluster (KUBECONFIG); the cluster needs the NVIDIA GPU Operator for `nvidia.com/gpu`"))


def _check_venv(engine: str, launch: LaunchConfig, field: str, run, timeout: float, name: str, hint: str) -> None:
    venv = os.path.abspath(launch.env.venv)
    if not os.path.isdir(venv):
        raise EngineMissing(field, f"the venv {venv} does not exist. {hint}")
    python = os.path.join(venv, "bin", "python")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise EngineMissing(field, f"{venv} is not a venv: it has no bin/python. {hint}")
    module = ENGINE_MODULES[engine]
    try:
        proc = run([python, "-c", FIND_SPEC, module], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineMissing(field, f"{python} did not answer within {timeout:g} s whether it has {module}") from None
    except OSError as err:
        raise EngineMissing(field, f"{python} cannot run ({err}). {hint}") from None
    if proc.returncode == 1:
        raise EngineMissing(field, f"{name} is not installed in the venv {venv} "
                            f"({python} cannot import {module}). {hint}")
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        raise EngineMissing(field, f"{python} failed (exit {proc.returncode}) looking for {module}: "
                            f"{' | '.join(tail) or 'no output'}. {hint}")
    if engine in ENGINE_RELEASES:
        _check_release(engine, python, venv, field, run, timeout, hint)
    if engine == "megatron":
        tools = ["torchrun"]
    else:  # the Slurm script starts the Ray cluster of a multi-node job itself
        tools = ["ray"] if launch.scheduler == "slurm" and launch.nodes > 1 else []
    for tool in tools:
        path = os.path.join(venv, "bin", tool)
        if not os.path.isfile(path):
            raise EngineMissing(field, f"the venv {venv} has {module} but no bin/{tool}, which the launch runs. {hint}")


def _check_release(engine: str, python: str, venv: str, field: str, run, timeout: float, hint: str) -> None:
    """The venv's release of the engine is the one its translation is pinned to (ENGINE_RELEASES)."""
    dist, pinned = ENGINE_RELEASES[engine]
    version = _installed_release(python, dist, ENGINE_MODULES[engine], venv, field, run, timeout, hint)
    if version is not None and version != pinned:
        raise EngineMissing(field, f"the venv {venv} has {dist} {version}, but stagewise's translation is "
                            f"validated against {dist} {pinned} (engines/megatron/release.py): another release "
                            f"may build a different config from the same overrides. Install {dist}=={pinned} "
                            f"there, or point this key at an environment that has it (docs/DEPLOY.md, "
                            f"\"Which Megatron-Bridge\").")


def _installed_release(python: str, dist: str, module: str, venv: str, field: str, run, timeout: float,
                       hint: str) -> str | None:
    """The release of `dist` the venv's python reports (RELEASE_OF), else its package_info.py's;
    None when the venv records neither."""
    try:
        proc = run([python, "-c", RELEASE_OF, dist, module], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineMissing(field, f"{python} did not answer within {timeout:g} s which {dist} it has") from None
    except OSError as err:
        raise EngineMissing(field, f"{python} cannot run ({err}). {hint}") from None
    try:
        found = json.loads((proc.stdout or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        found = None
    if proc.returncode != 0 or not isinstance(found, dict):
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        raise EngineMissing(field, f"{python} could not say which {dist} release the venv {venv} has "
                            f"(exit {proc.returncode}): {' | '.join(tail) or 'no output'}. {hint}")
    return found.get("version") or _package_info_version(found.get("dirs") or [])


_VERSION_PART = re.compile(r'^(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=\s*["\']?([^"\'\s#]*)', re.M)


def _package_info_version(dirs: list[str]) -> str | None:
    """The release a source checkout records in its package_info.py (MAJOR.MINOR.PATCH and the
    pre-release tag), read as text: importing it would import the package. None without one."""
    for d in dirs:
        try:
            text = open(os.path.join(d, "package_info.py"), encoding="utf-8").read()
        except OSError:
            continue
        parts = dict(_VERSION_PART.findall(text))
        if {"MAJOR", "MINOR", "PATCH"} <= set(parts):
            return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"
    return None
