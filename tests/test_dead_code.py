"""Finding H7: no dead code in the package.

Every module-level function, class and assigned name (constants and tables included, public or
private) of ``esper/`` must be used: referenced somewhere in ``esper/`` outside its own definition.
A name that nothing in the package uses is still alive when it is public API — listed in an
``__all__`` or public by name — *and* something outside the package calls it (``tests/``, ``bench/``,
``README.md``), or when it is an entry point. Anything else is dead (the original kept, for example,
max-entropy tables nothing read) and must be deleted, or listed in :data:`ALLOWED` with the reason.

References are found with :mod:`ast` (``Name`` and ``Attribute`` nodes), so a name mentioned only in a
comment or a docstring does not count; ``tests/``, ``bench/`` and the README count by whole word.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "esper"

#: Entry points: run by ``python -m`` or a console script, never referenced by name.
ENTRY_POINTS = {"main"}

#: ``module: name`` -> why it stays although neither the package nor its users reference it.
ALLOWED: dict[str, str] = {
    "esper.shell.env.governor: PANIC_REASONS": (
        "public API (in __all__): the documented vocabulary of Governor.check's return value and of the "
        "'reason' field of 'governor' events, for readers of events.jsonl"
    ),
}


@dataclass(frozen=True)
class Definition:
    module: str
    name: str
    kind: str
    path: Path
    first: int
    last: int

    @property
    def key(self) -> str:
        return f"{self.module}: {self.name}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _definitions(path: Path, tree: ast.Module) -> list[Definition]:
    module = _module_name(path)
    out = []

    def add(name: str, kind: str, node: ast.AST) -> None:
        if not (name.startswith("__") and name.endswith("__")):
            out.append(Definition(module, name, kind, path, node.lineno, node.end_lineno or node.lineno))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not any(_registers(d) for d in node.decorator_list):  # a registered impl is used by torch
                add(node.name, "function", node)
        elif isinstance(node, ast.ClassDef):
            add(node.name, "class", node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        add(t.id, "constant", node)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            add(node.target.id, "constant", node)
    return out


def _registers(decorator: ast.expr) -> bool:
    """``@op.register_fake``, ``@op.register_kernel("cpu")``, ``@torch.library.register_...``: the
    function is called through the registry, never by name."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return name.startswith("register")


def _exports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names |= {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
    return names


def _references(trees: dict[Path, ast.Module]) -> dict[str, list[tuple[Path, int]]]:
    """name -> every (file, line) where a ``Name`` or ``Attribute`` node mentions it."""
    refs: dict[str, list[tuple[Path, int]]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                refs.setdefault(node.id, []).append((path, node.lineno))
            elif isinstance(node, ast.Attribute):
                refs.setdefault(node.attr, []).append((path, node.lineno))
    return refs


def _outside_text() -> str:
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py"), ROOT / "README.md"]
    this = Path(__file__).resolve()
    return "\n".join(p.read_text() for p in files if p.is_file() and p.resolve() != this)


def unused_definitions() -> list[str]:
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in sorted(PACKAGE.rglob("*.py"))}
    refs = _references(trees)
    outside = _outside_text()
    dead = []
    for path, tree in trees.items():
        exported = _exports(tree)
        for d in _definitions(path, tree):
            used_inside = any(
                not (p == d.path and d.first <= line <= d.last) for p, line in refs.get(d.name, [])
            )
            if used_inside or d.name in ENTRY_POINTS or d.key in ALLOWED:
                continue
            public = d.name in exported or not d.name.startswith("_")
            if public and re.search(rf"\b{re.escape(d.name)}\b", outside):
                continue
            dead.append(f"{d.key} ({d.kind}, {d.path.relative_to(ROOT)}:{d.first})")
    return dead


def test_H7_no_dead_code():
    dead = unused_definitions()
    assert not dead, "defined but never used (delete, or list in ALLOWED with a reason):\n" + "\n".join(dead)


def test_H7_allow_list_entries_exist_and_are_still_needed():
    """Every ALLOWED entry names a real definition that the scan would otherwise report."""
    saved = dict(ALLOWED)
    try:
        ALLOWED.clear()
        dead = {line.split(" (")[0] for line in unused_definitions()}
    finally:
        ALLOWED.update(saved)
    stale = sorted(set(saved) - dead)
    assert not stale, f"ALLOWED entries that are used after all (or no longer exist): {stale}"


def test_H7_scanner_finds_a_planted_dead_table(tmp_path, monkeypatch):
    """The scan is not vacuous: an unused module-level table and helper are reported; a used one is not."""
    pkg = tmp_path / "esper"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "m.py").write_text(
        "_MAX_ENTROPY = {1: 0.0, 2: 0.69}\n"
        "USED = 3\n"
        "def _helper():\n    return _helper()\n"
        "def f():\n    return USED\n"
        "@f.register_fake\ndef _fake():\n    return None\n"
        "__all__ = ['f']\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_m.py").write_text("from esper.m import f\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    dead = unused_definitions()
    assert [line.split(" (")[0] for line in dead] == ["esper.m: _MAX_ENTROPY", "esper.m: _helper"]
