"""The package's import structure: no module imports, at load time, one that imports it back.

Module-level imports of pysharp's own modules form a graph read from the source with
``ast``; a cycle in it (flow <-> central_flow, models -> theory -> models were two) makes
the import order matter and hides a layering mistake. Imports inside functions are not
counted: they run after every module has loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pysharp

PACKAGE = Path(pysharp.__file__).resolve().parent


def module_graph() -> dict[str, set[str]]:
    """module -> the pysharp modules it imports at load time (package-relative names)."""
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        body = ast.parse(path.read_text()).body
        nodes = body + [n for b in body if isinstance(b, (ast.If, ast.Try)) for n in b.body]
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                    if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                subs = {f"{target}.{a.name}" for a in node.names} & files.keys()
                found = subs or ({target} & files.keys())
            elif isinstance(node, ast.Import):
                found = {a.name for a in node.names} & files.keys()
            else:
                continue
            graph[name] |= found - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

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
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(module_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "pysharp.central_flow" in module_graph()["pysharp.flow"]  # the graph is read
