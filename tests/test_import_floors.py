"""The package's folders import in one direction only (docs/design.md, "Floors").

The import graph is built with ``ast`` from every module under ``esper/``, imports inside functions
(lazy ones) included: a folder may import its own floor's other folders (one way) and any lower floor,
never a higher one, and no two folders may import each other, directly or round a longer loop.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "esper"

#: Floors, lowest first; a folder imports only its own floor and those below. "cli" is the shell's
#: top-level modules (run, evaluate, report); a new folder must be given a floor here and in docs/design.md.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("kernels",),
    ("shell.common",),
    ("shell.telemetry", "shell.data"),
    ("shell.host",),
    ("shell.env",),
    ("shell.agent", "shell.baselines"),
    ("shell.config",),
    ("shell.eval",),
    ("shell.runtime", "shell.user"),
    ("shell.cli", "shell.suite"),
)
FLOOR = {folder: level for level, names in enumerate(FLOORS) for folder in names}


def folder_of(module: str) -> str | None:
    """``esper.shell.env.vecenv`` -> ``shell.env``; ``esper.core.loss`` -> ``core``; a top-level shell
    module (``esper.shell.run``) -> ``shell.cli``; ``esper`` itself (and ``esper.shell``) -> None."""
    parts = module.split(".")[1:]
    if not parts or parts == ["shell"]:
        return None
    if parts[0] != "shell":
        return parts[0]
    if len(parts) == 2 and (PACKAGE / "shell" / f"{parts[1]}.py").is_file():
        return "shell.cli"
    return f"shell.{parts[1]}"


def module_name(path: Path) -> tuple[str, str]:
    """(the module's dotted name, the package relative imports resolve against)."""
    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        dotted = dotted.rsplit(".", 1)[0]
        return dotted, dotted
    return dotted, dotted.rsplit(".", 1)[0]


def imported(tree: ast.AST, package: str) -> list[tuple[str, int]]:
    """Every esper module a tree imports, at module level or inside a function, with its line."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return [(m, line) for m, line in out if m == "esper" or m.startswith("esper.")]


def import_graph(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> where (``path:line``), between different folders."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        name, pkg = module_name(path)
        src = folder_of(name)
        for target, line in imported(ast.parse(path.read_text()), pkg):
            dst = folder_of(target)
            if src and dst and dst != src:
                edges[src, dst].append(f"{path.relative_to(ROOT)}:{line}")
    return dict(edges)


def uphill(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    return [
        f"{a} (floor {FLOOR[a]}) imports {b} (floor {FLOOR[b]}): {where[0]}"
        for (a, b), where in sorted(edges.items())
        if FLOOR[b] > FLOOR[a]
    ]


def cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more folders (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_every_folder_of_the_package_has_a_floor():
    folders = {folder_of(module_name(p)[0]) for p in PACKAGE.rglob("*.py")} - {None}
    missing = folders - set(FLOOR)
    assert not missing, f"folders without a floor (add them to FLOORS and docs/design.md): {missing}"


def test_no_folder_imports_a_higher_floor():
    assert uphill(import_graph()) == []


def test_no_two_folders_import_each_other():
    assert cycles(import_graph()) == []


def test_the_floors_in_docs_design_are_the_ones_this_test_enforces():
    text = (ROOT / "docs" / "design.md").read_text()
    line = re.search(r"^Floors, lowest first: (.+)$", text, re.M)
    assert line, "docs/design.md must state the floors on a line 'Floors, lowest first: ...'"
    floors = line.group(1).rstrip(".").split(" < ")
    written = tuple(tuple(f.strip(" `") for f in floor.split(",")) for floor in floors)
    assert written == FLOORS


def test_the_checker_catches_an_uphill_import_and_a_loop(tmp_path):
    pkg = tmp_path / "esper"
    for sub, body in {
        "core/a.py": "from esper.shell.env import x\n",  # uphill: core imports the env
        "shell/env/b.py": "def f():\n    from esper.shell.agent import y\n",  # lazy, uphill
        "shell/agent/c.py": "from esper.shell.env.b import f\n",  # with the line above: a loop
    }.items():
        path = pkg / sub
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        edges = import_graph(pkg)
    finally:
        ROOT = saved
    problems = uphill(edges)
    assert any(p.startswith("core (floor 0) imports shell.env") for p in problems)
    assert any(p.startswith("shell.env (floor 5) imports shell.agent") for p in problems)
    assert cycles(edges) == [["shell.agent", "shell.env"]]


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
