"""The package's import structure: no cycles, no upward imports, no hidden imports.

Imports of pysharp's own modules form a graph read from the source with ``ast``. A cycle
at load time (flow <-> central_flow, models -> theory -> models were two) makes the import
order matter and hides a layering mistake. The layers (``LAYERS``, bottom to top) are the
architecture of docs/architecture.rst: a module imports only from its own layer and those
below, at load time or inside a function. An import inside a function hides a dependency
from the reader; one stays only where importing at load time would cost start-up time or
an optional package, and says so with a ``# lazy: <why>`` comment on its line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pysharp

PACKAGE = Path(pysharp.__file__).resolve().parent


#: The layers, bottom to top, each a tuple of module prefixes. The package's face
#: (pysharp/__init__.py) sits above all of them; the applications may use it as their
#: users do (``import pysharp as ps``).
LAYERS = (
    ("foundation", ("pysharp._version", "pysharp._engine", "pysharp._dormand_prince",
                    "pysharp.reference")),
    ("backends", ("pysharp._backends",)),
    ("models", ("pysharp.models",)),
    ("engine", ("pysharp.dynamics", "pysharp.sgd", "pysharp.sharpness", "pysharp.spectra")),
    ("analysis", ("pysharp.stability", "pysharp.flow", "pysharp.central_flow",
                  "pysharp.period_two", "pysharp.theory")),
    ("frameworks", ("pysharp.jax", "pysharp.torch")),
    ("applications", ("pysharp.sweeps", "pysharp.reproduce", "pysharp.cli",
                      "pysharp.__main__")),
)


def layer_of(module: str) -> int:
    """Index of ``module``'s layer in LAYERS; len(LAYERS) for the package itself."""
    if module == "pysharp":
        return len(LAYERS)
    found = [i for i, (_, prefixes) in enumerate(LAYERS)
             if any(module == p or module.startswith(p + ".") for p in prefixes)]
    assert len(found) == 1, f"{module} must belong to exactly one layer of LAYERS, not {found}"
    return found[0]


def _modules() -> dict[str, Path]:
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _imports(name: str, path: Path, files, nodes):
    """(pysharp module imported, import node) for each import among ``nodes``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
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
        for module in found - {name}:
            yield module, node


def function_imports() -> list[tuple[str, str, int, str]]:
    """(module, imported module, line, source line) of every import inside a function."""
    files = _modules()
    out = []
    for name, path in files.items():
        text = path.read_text()
        lines = text.split("\n")
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
                for module, node in _imports(name, path, files, inner):
                    out.append((name, module, node.lineno, lines[node.lineno - 1]))
    return out


def module_graph() -> dict[str, set[str]]:
    """module -> the pysharp modules it imports at load time (package-relative names)."""
    files = _modules()
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        body = ast.parse(path.read_text()).body
        nodes = body + [n for b in body if isinstance(b, (ast.If, ast.Try)) for n in b.body]
        graph[name] |= {module for module, _ in _imports(name, path, files, nodes)}
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


def test_every_module_has_a_layer_and_none_imports_upward():
    graph = module_graph()
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, targets in graph.items() for b in targets
              if layer_of(b) > layer_of(a)
              and not (b == "pysharp" and LAYERS[layer_of(a)][0] == "applications")]
    upward += [f"{a} imports {b} inside a function (line {line})"
               for a, b, line, _ in function_imports() if layer_of(b) > layer_of(a)]
    assert upward == []


def test_an_import_inside_a_function_says_why():
    silent = [f"{a}:{line}: {text.strip()}" for a, _, line, text in function_imports()
              if "# lazy:" not in text]
    assert silent == [], "hoist these to the module's top, or say '# lazy: <why>'"


def test_the_layer_checks_see_what_they_check():
    assert layer_of("pysharp._backends._numba_kernels") == 1
    assert layer_of("pysharp.sweeps._sweep") == len(LAYERS) - 1
    hidden = {(a, b) for a, b, _, _ in function_imports()}
    assert ("pysharp._backends._fallback", "pysharp._backends._numba_kernels") in hidden
