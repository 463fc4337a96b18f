"""What the stand-in engines share: a "venv" whose bin/ tools run this interpreter with the
stand-in's modules importable, a "checkout" of entry scripts, and `stagewise run` with stages
launched on a stand-in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def fake_venv(root: Path, packages: list[str], tools: dict[str, str]) -> Path:
    """`root/venv`: bin/<tool> shell wrappers running `tools[tool]` (a command line, e.g. this
    interpreter) with `root/site` on PYTHONPATH, where each of `packages` (dotted) is an empty package."""
    venv, site = root / "venv", root / "site"
    for package in packages:
        parts = package.split(".")
        for i in range(1, len(parts) + 1):
            (site.joinpath(*parts[:i])).mkdir(parents=True, exist_ok=True)
            (site.joinpath(*parts[:i]) / "__init__.py").touch()
    (venv / "bin").mkdir(parents=True)
    for name, target in tools.items():
        tool = venv / "bin" / name
        tool.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            export PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"
            exec {target} "$@"
            """))
        tool.chmod(0o755)
    return venv


def write_checkout(checkout: Path, scripts: dict[str, str]) -> Path:
    """The stand-in's checkout: each relative path with its script text."""
    for rel, text in scripts.items():
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text(text)
    return checkout


PYTHON = f'"{Path(sys.executable)}"'
"""This interpreter, as a fake venv's bin/python runs it."""


def run_stagewise(recipe: Path, stages: str, launched: list[str], engine: str, fake: tuple[Path, Path],
                  sets: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """`stagewise run RECIPE --stages STAGES --json` with each of `launched` on `engine`, launched
    on the stand-in (`fake`: its venv and checkout) over 2 "GPUs"."""
    venv, checkout = fake
    launch = f"{{env: {{venv: {venv}, workdir: {checkout}}}, gpus_per_node: 2}}"
    sets = [s for name in launched for s in (f"stages.{name}.engine={engine}", f"stages.{name}.launch={launch}")] + sets
    cmd = [sys.executable, "-m", "stagewise.cli", "run", str(recipe), "--stages", stages, "--json"]
    cmd += [a for s in sets for a in ("--set", s)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CI": "1", **(env or {})})
