"""The import graph of src/stockade has no circles (HOUSE_STYLE: "the import
graph has no circles").

Every import counts, wherever it is written: at the top of a module, under
``if TYPE_CHECKING:`` and inside a function. A function-level import does not
fail at import time, but it is a dependency all the same: the two modules can
no longer be understood, tested or moved apart, and a lazy import is the usual
way a circle gets hidden rather than broken. So a circle closed by a lazy or a
type-only import is a circle here.

How an import becomes an edge:

* ``import a.b.c`` and ``from a.b import c`` (``c`` a submodule) are edges to
  ``a.b.c``.
* ``from a.b import name`` (``name`` not a submodule) is an edge to the module
  that defines ``name``: when ``a.b`` is a package whose ``__init__`` only
  re-exports ``name`` from a submodule, the edge goes to that submodule (followed
  through chains of re-exports). Counting it as an edge to the ``__init__``
  would make every module that imports a sibling's public name through the
  package a member of a false circle with every other module the ``__init__``
  imports.
* The parent packages a dotted import initialises on the way (``a`` and ``a.b``
  for ``import a.b.c``) are not edges: Python initialises a package before its
  submodules, and a submodule can be imported while its package is still part
  way through its ``__init__``.
* ``importlib.import_module(...)`` with a computed name (``stockade.__getattr__``'s
  lazy table) is not seen; the names it serves are imported statically under
  ``TYPE_CHECKING`` in the same file, and those are counted.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

import stockade

SRC = Path(stockade.__file__).resolve().parent


def module_files(root: Path) -> dict[str, Path]:
    """Every module under ``root`` (a package directory) by dotted name.

    A C extension (``cell/_native``, ``broker/_fastread``) is known by its stub,
    the ``.pyi`` beside its ``.c`` source: without it ``from stockade.cell import
    _native`` would look like an import of the package's ``__init__``."""
    base = root.parent
    found: dict[str, Path] = {}
    sources = sorted(root.rglob("*.py"))
    stubs = [p for p in sorted(root.rglob("*.pyi")) if not p.with_suffix(".py").exists()]
    for path in sources + stubs:
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _package_of(module: str, path: Path) -> str:
    """The package a relative import in ``module`` is relative to."""
    return module if path.stem == "__init__" else module.rpartition(".")[0]


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = _package_of(module, path).split(".")
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


class Graph:
    """The modules of one package tree and who imports whom."""

    def __init__(self, root: Path) -> None:
        self.files = module_files(root)
        self.prefix = root.name
        self._trees = {name: ast.parse(p.read_text(), str(p)) for name, p in self.files.items()}
        self.edges: dict[str, set[str]] = {name: set() for name in self.files}
        for name in self.files:
            for target in self._imports(name):
                if target != name:
                    self.edges[name].add(target)

    def _known(self, dotted: str) -> str | None:
        """The longest prefix of ``dotted`` that is one of our modules."""
        parts = dotted.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in self.files:
                return candidate
            parts.pop()
        return None

    def _defining(self, package: str, name: str, seen: frozenset[str] = frozenset()) -> str:
        """The module that defines ``name`` when it is imported from ``package``."""
        if f"{package}.{name}" in self.files:
            return f"{package}.{name}"
        if package in seen or self.files[package].stem != "__init__":
            return package
        for node in ast.walk(self._trees[package]):
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                source = self._known(_absolute(package, self.files[package], node))
                if source is None:
                    continue
                original = next(a.name for a in node.names if (a.asname or a.name) == name)
                return self._defining(source, original, seen | {package})
        return package

    def _imports(self, module: str) -> Iterable[str]:
        path = self.files[module]
        for node in ast.walk(self._trees[module]):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = self._known(alias.name)
                    if target is not None:
                        yield target
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, path, node)
                if base.split(".")[0] != self.prefix:
                    continue
                known = self._known(base)
                if known is None:
                    continue
                for alias in node.names:
                    if alias.name == "*" or known != base:
                        yield known
                    else:
                        yield self._defining(known, alias.name)


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan),
    each sorted, the list sorted; iterative, so a deep graph cannot overflow."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


@functools.cache
def _src_graph() -> Graph:
    """The graph of src/stockade, parsed once for the tests that read it."""
    return Graph(SRC)


def _describe(component: list[str], edges: Mapping[str, set[str]]) -> str:
    members = set(component)
    inside = [f"    {a} -> {b}" for a in component for b in sorted(edges[a]) if b in members]
    return "  circle of {}: {}\n{}".format(len(component), ", ".join(component), "\n".join(inside))


def test_the_package_imports_form_no_circle() -> None:
    graph = _src_graph()
    found = cycles(graph.edges)
    assert not found, "import circles in src/stockade (every import counts):\n" + "\n".join(
        _describe(c, graph.edges) for c in found
    )


def test_the_graph_sees_the_imports_it_must_see() -> None:
    # A control: a parser that saw nothing would find no circle either.
    graph = _src_graph()
    assert len(graph.files) > 100
    assert sum(len(e) for e in graph.edges.values()) > 300
    assert "stockade.daemon._peer" in graph.edges["stockade.daemon._server"]
    # ``from stockade.record import Event`` is an edge to where Event is defined.
    defined_in = graph._defining("stockade.record", "Event")
    assert defined_in.startswith("stockade.record._"), defined_in
    assert defined_in in graph.edges["stockade.daemon._bus"]


def _daemon_imports(graph: Graph, module: str) -> set[str]:
    return {m for m in graph.edges[f"stockade.daemon.{module}"] if m.startswith("stockade.daemon.")}


def test_the_daemon_is_layered_as_docs_daemon_says() -> None:
    # docs/DAEMON.md, "How it is built": the run is passive data at the
    # bottom; the intent path is below the runs that make it; a peer knows the
    # daemon only as a protocol; tool.record knows the intent path only so.
    graph = _src_graph()
    assert _daemon_imports(graph, "_run") == set()
    assert _daemon_imports(graph, "_requests") == set()
    assert "stockade.daemon._runs" not in _daemon_imports(graph, "_intent_path")
    assert "stockade.daemon._runs" not in _daemon_imports(graph, "_agents")
    assert "stockade.daemon._server" not in _daemon_imports(graph, "_peer")
    assert "stockade.daemon._intent_path" not in _daemon_imports(graph, "_tools")
    assert "stockade.daemon._intent_path" in _daemon_imports(graph, "_runs")


def test_the_record_is_below_the_cell() -> None:
    # HOUSE_STYLE's direction, policy <- cell, broker, gateway, record <-
    # daemon: the record (events, store, chain, exports) imports no layer
    # above it; the kernel audit reader, which knows cells, is the cell's.
    graph = _src_graph()
    record = [m for m in graph.edges if m.startswith("stockade.record")]
    assert "stockade.record._store" in record  # the walk found the package
    upward = {
        (m, to)
        for m in record
        for to in graph.edges[m]
        if to.startswith(("stockade.cell", "stockade.daemon", "stockade.broker", "stockade.gateway"))
    }
    assert upward == set()
    assert "stockade.record._event" in graph.edges["stockade.cell._audit"]


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_closed_under_type_checking_or_in_a_function_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    _write(
        pkg,
        {
            "__init__.py": "from pkg._b import B\n",
            "_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import B\n",
            "_b.py": "class B:\n    def f(self):\n        from . import _c\n",
            "_c.py": "from ._a import *\n",
            "_d.py": "import pkg._a\n",
        },
    )
    graph = Graph(pkg)
    found = cycles(graph.edges)
    assert found == [["pkg._a", "pkg._b", "pkg._c"]]
    # The re-export went to its definition, not to the package's __init__.
    assert graph.edges["pkg._a"] == {"pkg._b"}
    assert "circle of 3" in _describe(found[0], graph.edges)


def test_a_package_that_re_exports_its_submodules_is_no_false_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    _write(
        pkg,
        {
            "__init__.py": "from pkg._a import A\nfrom pkg._b import B as Bee\n",
            "_a.py": "class A: ...\n",
            "_b.py": "from pkg import A\nclass B: ...\n",
            "sub/__init__.py": "from .._b import B\n",
            "sub/_c.py": "from pkg.sub import B\nfrom .. import Bee\n",
        },
    )
    graph = Graph(pkg)
    assert cycles(graph.edges) == []
    assert graph.edges["pkg._b"] == {"pkg._a"}
    assert graph.edges["pkg.sub._c"] == {"pkg._b"}
