"""The house's shape: one import root, rooms linked into it, no circles between rooms, none too big.

The repository keeps its rooms as top-level folders (flows/, model/, recipe/, ...) and installs
them under one name, `stagewise`, through links in stagewise/ (stagewise/flows -> ../flows). These
tests hold the rules that layout needs to stay true as code is added: every room is linked and
every link is a room, nothing imports a room by its bare name (that would work in a checkout and
fail in an installed wheel), files of different rooms never import each other in a circle, and
no room grows above a third of the code.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "stagewise"
NOT_ROOMS = {"tests", "benchmarks", "docs", "recipes", "stagewise", "build"}
PACKAGE_DATA_LINKS = {"recipes"}


def _rooms() -> set[str]:
    """Top-level folders that are Python packages: the rooms."""
    return {p.name for p in REPO.iterdir() if p.is_dir() and not p.is_symlink() and (p / "__init__.py").is_file()
            and p.name not in NOT_ROOMS and not p.name.startswith(".")}


def _modules() -> dict[str, Path]:
    """stagewise.<room>.<...> -> its file, for every module of every room."""
    out = {}
    for room in _rooms():
        for f in (REPO / room).rglob("*.py"):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(["stagewise", *parts])] = f
    for f in ROOT.glob("*.py"):
        out["stagewise" if f.stem == "__init__" else f"stagewise.{f.stem}"] = f
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The stagewise modules a file imports, anywhere in it (lazy imports inside functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in _rooms() else "(root)"


def test_every_room_is_linked_into_the_import_root_and_every_link_is_a_room():
    links = {p.name: p for p in ROOT.iterdir() if p.is_symlink()}
    assert set(links) == _rooms() | PACKAGE_DATA_LINKS
    for name, link in links.items():
        assert os.readlink(link) == f"../{name}", f"stagewise/{name} must point at ../{name}"


def test_no_file_imports_a_room_by_its_bare_name():
    """`import model` works in a checkout (the repository on sys.path) and fails in an installed wheel."""
    rooms = _rooms()
    bad = []
    for f in [*REPO.glob("*.py"), *(p for d in (*rooms, "tests", "benchmarks") for p in (REPO / d).rglob("*.py"))]:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            bad += [f"{f.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in rooms]
    assert not bad, "import through the root (`stagewise.<room>`):\n" + "\n".join(bad)


def _cycles_across_rooms(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan) that hold modules of more than one room."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len({_room(m) for m in comp}) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_runs_between_files_of_different_rooms():
    modules = _modules()
    graph = defaultdict(set)
    for name, path in modules.items():
        for dep in _imports(path, modules):
            if dep != name and not name.startswith(dep + "."):  # a package's own __init__ is not a circle
                graph[name].add(dep)
    assert _cycles_across_rooms(graph) == []


def test_the_circle_finder_finds_a_circle_between_rooms():
    """The check above can fail: two files of different rooms importing each other are found."""
    graph = {"stagewise.flows.a": {"stagewise.model.b"}, "stagewise.model.b": {"stagewise.flows.a"},
             "stagewise.model.c": {"stagewise.model.d"}, "stagewise.model.d": {"stagewise.model.c"}}
    assert _cycles_across_rooms(graph) == [["stagewise.flows.a", "stagewise.model.b"]]


def test_no_room_holds_more_than_a_third_of_the_code():
    lines = defaultdict(int)
    for name, path in _modules().items():
        lines[_room(name)] += len(path.read_text().splitlines())
    total = sum(lines.values())
    assert max(lines.values()) <= total / 3, dict(lines)


def test_an_editor_resolves_every_rooms_imports_through_the_links():
    """Jedi (the completion engine behind many editors' Python support) resolves `stagewise.<room>`
    imports from the checkout alone: through the links, with no import hook and no configuration.
    Each module's first `from stagewise... import` is resolved to a file of the checkout; a module
    that does not exist is not (so the check can fail)."""
    import jedi

    project = jedi.Project(REPO, added_sys_path=[], smart_sys_path=False)
    unresolved = []
    for path in sorted(_modules().values()):
        src = path.read_text()
        first = next((n for n in ast.parse(src).body if isinstance(n, ast.ImportFrom) and n.module
                      and n.module.startswith("stagewise.")), None)
        if first is None:
            continue
        col = src.splitlines()[first.lineno - 1].index(first.module) + len(first.module) - 1
        found = jedi.Script(src, path=path, project=project).goto(first.lineno, col, follow_imports=True)
        if not found or found[0].module_path is None or ROOT not in Path(found[0].module_path).parents:
            unresolved.append(f"{path.relative_to(REPO)}:{first.lineno}: {first.module}")
    assert not unresolved, "\n".join(unresolved)
    missing = jedi.Script("from stagewise.no_such_room.x import y\n", path=REPO / "cli" / "probe.py", project=project)
    assert missing.goto(1, 25, follow_imports=True) == []


# --------------------------------------------------------------------------- who may import whom

LIBRARIES = ("data", "model", "eval", "quant")
"""Plain Python, usable from a notebook, a launched job or another orchestrator (docs/DESIGN.md)."""
NOT_FOR_LIBRARIES = ("prefect", "mlflow", "stagewise.tasks", "stagewise.flows", "stagewise.store", "stagewise.cli",
                     "stagewise.deployments")


def _imported_names(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in `source`, at any depth (inside functions, under
    TYPE_CHECKING, in try blocks): `from a.b import c` gives a.b and a.b.c."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _forbidden_in_library(source: str) -> list[tuple[int, str]]:
    return [(line, name) for line, name in _imported_names(source)
            if any(name == bad or name.startswith(bad + ".") for bad in NOT_FOR_LIBRARIES)]


def test_the_libraries_import_no_orchestration():
    """data/, model/, eval/ and quant/ import no Prefect, no MLflow and nothing of the rooms that
    orchestrate (tasks, flows, store, cli, deployments), however deep the import sits."""
    bad = [f"{path.relative_to(REPO)}:{line}: {name}"
           for name_, path in sorted(_modules().items()) if _room(name_) in LIBRARIES
           for line, name in _forbidden_in_library(path.read_text())]
    assert not bad, "a library imports orchestration:\n" + "\n".join(bad)


def test_the_library_check_finds_a_nested_prefect_or_store_import():
    source = ("import torch\n"
              "def f():\n    from prefect import task\n"
              "if True:\n    import mlflow.tracking\n"
              "def g():\n    from stagewise.store.steps import step_dir\n"
              "from stagewise.data.errors import BadInput\n")
    assert [name for _, name in _forbidden_in_library(source)] == [
        "prefect", "prefect.task", "mlflow.tracking", "stagewise.store.steps", "stagewise.store.steps.step_dir"]


def room_imports() -> dict[str, set[str]]:
    """room -> the other rooms its files import (any depth); `stagewise` for the import root's own modules."""
    modules = _modules()
    out: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for dep in _imports(path, modules):
            a, b = _room(name), _room(dep)
            if a != b:
                out[a].add("stagewise" if b == "(root)" else b)
    return {room: out.get(room, set()) for room in _rooms()}


def _mutual(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, deps in graph.items() for b in deps if a < b and a in graph.get(b, ()))


def test_no_two_rooms_import_each_other():
    assert _mutual(room_imports()) == []


def test_the_mutual_check_finds_two_rooms_importing_each_other():
    assert _mutual({"flows": {"engines", "recipe"}, "engines": {"flows"}, "recipe": set()}) == [("engines", "flows")]


def _design_table() -> dict[str, set[str]]:
    """docs/DESIGN.md's layout table: room -> the rooms its `imports` column names (backquoted)."""
    import re

    out = {}
    for line in (REPO / "docs" / "DESIGN.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        room = re.fullmatch(r"`(\w+)/`", cells[0]) if cells else None
        if room and room.group(1) in _rooms():
            out[room.group(1)] = set(re.findall(r"`(\w+)`", cells[-1]))
    return out


def test_the_design_pages_room_table_says_what_each_room_imports():
    """The `imports` column of docs/DESIGN.md's layout table is each room's real imports, room for room."""
    table, real = _design_table(), room_imports()
    assert set(table) == set(real), "every room has a row in docs/DESIGN.md's layout table"
    wrong = {room: {"table": sorted(table[room]), "code": sorted(real[room])}
             for room in real if table[room] != real[room]}
    assert not wrong, wrong
