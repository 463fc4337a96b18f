"""The built wheel works outside the repository: one import root, recipes by name, a real run.

A checkout hides packaging mistakes: its root is on sys.path (so `import model` works whether
or not the wheel has a top-level `model`), the editable install maps `stagewise` onto the
source tree, and a recipe can be found through the tree. So this builds the wheel, installs it
into a throwaway virtualenv and drives it from a directory that is not the repository, as a
user who ran `pip install stagewise` would:

- the wheel holds `stagewise/` and its dist-info and nothing else (top_level.txt is
  "stagewise"), with the package data the commands read (recipes, eval task data);
- the old top-level names (`model`, `data`, ...) are not importable, and `stagewise` is the
  installed copy, not the checkout;
- `stagewise --help`, `stagewise recipe show tiny` and a short `stagewise run tiny` work;
- every Prefect deployment's entrypoint is a `stagewise.` module path that loads there.

The throwaway venv reuses this interpreter's installed dependencies through a .pth file naming
its site-packages: a plain path line is appended to sys.path, but the .pth files inside that
directory (the editable-install hook among them) are not run, so the checkout's stagewise stays
invisible while torch, Prefect and MLflow need no second install. The wheel is unzipped into
the venv's site-packages (what pip does for a pure-Python wheel, minus the console script,
which is why the commands run as `python -m stagewise.cli`).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
OLD_TOP_LEVEL_PACKAGES = ["model", "data", "eval", "flows", "tasks"]
"""Importable from the top before the one import root; an install must not bring them back."""

PRETRAIN_SETS = [
    "stages.pretrain.tokens=49152",  # 12 steps of 4096 tokens
    "stages.pretrain.schedule.warmup_tokens=4096",  # the recipe's 73,728 must stay below the stage's tokens
    "stages.pretrain.val_tokens=8192",  # the recipe scores 65,536 per evaluation, more than this run trains
]


@dataclass(frozen=True)
class Install:
    python: Path
    """The throwaway venv's interpreter."""
    site_packages: Path
    """Where the wheel was unzipped."""
    elsewhere: Path
    """An empty working directory outside the repository."""


def _clean_env() -> dict[str, str]:
    """This environment without anything that points Python at the checkout; CI=1 for plain progress output."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    return env | {"CI": "1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from the repository root without writing into the repository.

    setuptools builds in a `build/` folder and an egg-info next to the sources, and keeps what an
    earlier build left in build/lib: a module since deleted from the tree would still ship and
    hide a packaging bug. DIST_EXTRA_CONFIG (read by setuptools' distutils) moves both into a
    fresh temporary folder, so the wheel holds exactly the tree as it is now.
    """
    scratch = tmp_path_factory.mktemp("wheel-build")
    extra_config = scratch / "setup-extra.cfg"
    extra_config.write_text(f"[build]\nbuild_base = {scratch / 'build'}\n[egg_info]\negg_base = {scratch}\n")
    out = scratch / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check",
         "-q", "-w", str(out), str(REPO_ROOT)],
        cwd=scratch, env=_clean_env() | {"DIST_EXTRA_CONFIG": str(extra_config)},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = out.glob("stagewise-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Install:
    """A fresh venv holding the wheel, with this interpreter's dependencies on its path."""
    root = tmp_path_factory.mktemp("throwaway-venv")
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             env=_clean_env(), capture_output=True, text=True, check=True).stdout.strip()
    site_packages = Path(purelib)
    (site_packages / "reuse-the-test-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site_packages)
    return Install(python, site_packages, tmp_path_factory.mktemp("elsewhere"))


def _python(install: Install, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """The venv's python from a directory outside the repository, with no path to the checkout."""
    return subprocess.run([str(install.python), *args], cwd=install.elsewhere, env=_clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def _printed_json(proc: subprocess.CompletedProcess):
    """The JSON a probe printed as its last line (libraries may print before it)."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_summary(proc: subprocess.CompletedProcess) -> dict:
    """The JSON document `stagewise run --json` prints (as tests/e2e read it)."""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def _inside(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def test_the_wheel_holds_only_the_stagewise_package_and_its_data(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["stagewise"]
    dist_info = top_level.split("/")[0]
    assert dist_info.startswith("stagewise-")
    strays = [n for n in names if not n.startswith(("stagewise/", f"{dist_info}/"))]
    assert not strays, f"files outside stagewise/ in the wheel: {strays[:10]}"
    shipped_recipes = {n.removeprefix("stagewise/recipes/") for n in names if n.startswith("stagewise/recipes/")}
    assert "tiny.yaml" in shipped_recipes and shipped_recipes == {p.name for p in (REPO_ROOT / "recipes").glob("*.yaml")}
    task_data = {n.removeprefix("stagewise/eval/benchmarks/data/") for n in names if n.startswith("stagewise/eval/benchmarks/data/")}
    assert task_data and task_data == {p.name for p in (REPO_ROOT / "eval" / "benchmarks" / "data").glob("*.jsonl")}


def test_only_the_installed_stagewise_is_importable(installed):
    """The old top-level packages are gone, and `stagewise` is the venv's copy, not the checkout."""
    probe = f"""
import importlib, json, stagewise
outcome = {{}}
for name in {OLD_TOP_LEVEL_PACKAGES!r}:
    try:
        importlib.import_module(name)
        outcome[name] = "imported"
    except ModuleNotFoundError as e:
        outcome[name] = "ModuleNotFoundError" if e.name == name else f"ModuleNotFoundError({{e.name}})"
print(json.dumps({{"imports": outcome, "stagewise": stagewise.__file__}}))
"""
    found = _printed_json(_python(installed, "-c", probe))
    assert found["imports"] == dict.fromkeys(OLD_TOP_LEVEL_PACKAGES, "ModuleNotFoundError")
    assert _inside(found["stagewise"], installed.site_packages) and not _inside(found["stagewise"], REPO_ROOT)
    printed = _python(installed, "-c", "import stagewise, sys; print(stagewise.__file__)")
    assert printed.returncode == 0 and _inside(printed.stdout.strip(), installed.site_packages), printed.stderr


def test_the_cli_helps_and_shows_a_shipped_recipe_by_name(installed):
    helped = _python(installed, "-m", "stagewise.cli", "--help")
    assert helped.returncode == 0 and "run" in helped.stdout, helped.stderr[-3000:]
    shown = _python(installed, "-m", "stagewise.cli", "recipe", "show", "tiny")
    assert shown.returncode == 0, shown.stderr[-3000:]
    header, *body = shown.stdout.splitlines()
    assert _inside(header.removeprefix("# ").split("  (recipe hash")[0], installed.site_packages / "stagewise" / "recipes")
    assert "name: tiny" in body and any(line.startswith("stages:") for line in body)


def test_the_deployment_entrypoints_load_from_the_installed_package(installed):
    """Each deployment's entrypoint is loaded the way a Prefect worker loads it, from the venv."""
    probe = """
import json, sys
from prefect.flows import load_flow_from_entrypoint
from stagewise.deployments.catalog import build_deployments
from stagewise.recipe.shipped import shipped_recipe

rows = []
for d in build_deployments(shipped_recipe("tiny")):
    flow = load_flow_from_entrypoint(d.entrypoint, use_placeholder_flow=False)
    module = d.entrypoint.rpartition(".")[0]
    rows.append({"name": d.name, "entrypoint": d.entrypoint, "flow": flow.name, "expected_flow": d.flow_name,
                 "module_file": sys.modules[module].__file__, "recipe": d.parameters.get("recipe")})
print(json.dumps(rows))
"""
    rows = _printed_json(_python(installed, "-c", probe))
    assert "pipeline" in {r["name"] for r in rows}
    for row in rows:
        assert row["entrypoint"].startswith("stagewise."), row
        assert row["flow"] == row["expected_flow"], row
        assert _inside(row["module_file"], installed.site_packages), row
        assert row["recipe"] is None or _inside(row["recipe"], installed.site_packages), row


def test_a_short_pretraining_runs_from_the_installed_package(installed, wheel, tmp_path):
    """`stagewise run tiny` end to end on CPU; its data, checkpoints and MLflow store go to the
    workdir, nothing into the installed package."""
    workdir = tmp_path / "work"
    sets = [a for v in [*PRETRAIN_SETS, f"workdir={workdir}"] for a in ("--set", v)]
    summary = _run_summary(_python(installed, "-m", "stagewise.cli", "run", "tiny", "--stages", "pretrain", *sets, "--json",
                               timeout=600))
    (stage,) = summary["stages"]
    assert stage["stage"] == "pretrain" and stage["tokens"] == 49152 and not stage["reused"]
    assert stage["after"] < stage["before"]
    assert _inside(stage["checkpoint"], workdir) and Path(stage["checkpoint"]).is_dir()
    assert summary["tracking_uri"] == f"sqlite:///{workdir / 'mlflow.db'}"
    package = installed.site_packages / "stagewise"
    now = {p.relative_to(installed.site_packages).as_posix() for p in package.rglob("*")
           if p.is_file() and "__pycache__" not in p.parts}
    with zipfile.ZipFile(wheel) as archive:
        assert now == {n for n in archive.namelist() if n.startswith("stagewise/")}
