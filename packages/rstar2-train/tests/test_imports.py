"""rstar2-train's modules import one way: no import circle, lazy imports inside functions
included (a circle held together by a function-level import breaks as soon as someone moves
it to the top)."""

from __future__ import annotations

import ast
from pathlib import Path

import rstar2_train

ROOT = Path(rstar2_train.__file__).parent


def _module(path: Path) -> str:
    parts = ("rstar2_train", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts).removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package modules it imports anywhere in its code."""
    modules = {_module(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m not in (name, "rstar2_train")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in import order, the first repeated at the end)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            cycle = visit(nxt, [*path, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle is not None:
            return cycle
    return None


def test_the_finder_reports_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    graph = import_graph()
    assert {"rstar2_train.modeling", "rstar2_train.placement.ranks"} <= set(graph)
    assert "rstar2_train.precision" in graph["rstar2_train.placement.ranks"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
