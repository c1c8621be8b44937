"""Core functions a reader can hold (issue 88): no function in ``esper/core`` is longer than
:data:`MAX_LINES` lines, counted from its ``def`` line to the last line of its body, docstring included
(``ast``'s ``end_lineno - lineno + 1``; decorators not counted). Nested functions and methods count on
their own, and inside their enclosing function."""

from __future__ import annotations

import ast
import pathlib

import esper.core

MAX_LINES = 80
CORE = pathlib.Path(esper.core.__file__).resolve().parent


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, def line, length)`` of every function and method in ``source``, nested
    ones included (``outer.<locals>.inner``, ``Class.method``)."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_length_counter_sees_nested_functions_and_methods():
    source = "def a():\n    def b():\n        pass\n    return b\n\n\n"
    source += "class C:\n    def m(self):\n        x = 1\n"
    assert function_lengths(source) == [("a", 1, 4), ("a.<locals>.b", 2, 2), ("C.m", 8, 2)]


def test_no_core_function_is_longer_than_80_lines():
    modules = sorted(CORE.rglob("*.py"))
    assert modules, CORE
    offenders = [
        f"{path.relative_to(CORE.parent.parent)}:{line} {name} ({length} lines)"
        for path in modules
        for name, line, length in function_lengths(path.read_text())
        if length > MAX_LINES
    ]
    head = f"functions in esper/core over {MAX_LINES} lines (split them into named steps):"
    assert not offenders, "\n".join([head, *offenders])
