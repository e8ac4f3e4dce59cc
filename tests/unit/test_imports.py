"""The import graph of ``gateway``: no cycle, and each layer imports only downwards.

The layers are the table of docs/architecture.md ("Layers"), held here as
:data:`LAYERS` and checked against the document: a module belongs to the
longest entry that names it, and imports only its own entry's modules and
the layers below its own.

Read from the source with :mod:`ast`, never by importing it: a cycle can make
an import fail halfway, and this test must still name the cycle then. What
counts as an import:

- ``import gateway.a.b`` and ``from gateway.a import b`` (``b`` a submodule):
  an edge to ``gateway.a.b``; ``from gateway.a import name`` (not a module)
  and ``import gateway.a``: an edge to ``gateway.a``, its ``__init__.py`` if it
  is a package. Relative imports are resolved against the importing module.
- Imports inside functions count (they run, only later); imports under
  ``if TYPE_CHECKING:`` do not (they never run), except for the type
  checker's own picture, which must be free of cycles too.
- The parent packages Python also executes on the way (``gateway.a`` for
  ``gateway.a.b``) are no edges of their own, as in import-linter and pydeps:
  otherwise every package whose ``__init__`` re-exports a submodule would be
  a cycle with it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import itertools
import pkgutil
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.paths import ROOT

PACKAGE = "gateway"


@dataclass(frozen=True)
class Import:
    """One import statement's target, as written and where."""

    target: str  # the absolute dotted name, ``a.b`` for ``from a import b`` too
    base: str  # the module part: ``a`` for ``from a import b``, the target for ``import a.b``
    line: int


def package_modules(package: str = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` by dotted name, found without importing any of it."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    [root] = spec.submodule_search_locations
    modules = {package: Path(root) / "__init__.py"}

    def walk(path: Path, prefix: str) -> None:
        for info in pkgutil.iter_modules([str(path)], prefix):
            leaf = info.name.rpartition(".")[2]
            if info.ispkg:
                modules[info.name] = path / leaf / "__init__.py"
                walk(path / leaf, info.name + ".")
            else:
                modules[info.name] = path / f"{leaf}.py"

    walk(Path(root), package + ".")
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(
    source: str, module: str, is_package: bool, type_checking: bool = False
) -> Iterator[Import]:
    """The imports of one module's source: module level and in functions, and TYPE_CHECKING's
    only if ``type_checking``."""
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:  # only the body is for the type checker
                yield from visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise ValueError(f"{module}:{node.lineno}: relative import beyond the top")
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            for alias in node.names:
                yield Import(f"{base}.{alias.name}", base, node.lineno)
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(ast.parse(source))


def attribute_uses(source: str, dotted: str) -> list[int]:
    """Lines that spell ``dotted`` (``trio.testing``) as an attribute chain in code."""
    head, _, attr = dotted.rpartition(".")
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == attr
            and ast.unparse(node.value) == head
        ):
            lines.append(node.lineno)
    return lines


@dataclass
class Graph:
    root: Path  # the directory that holds the package
    modules: dict[str, Path]
    edges: dict[str, dict[str, int]]  # importer -> imported -> first line
    external: dict[str, list[tuple[str, int]]]  # importer -> (every import's target, line)

    def resolve(self, imp: Import) -> str | None:
        """The gateway module an import names, or None if it is outside the package."""
        if imp.target in self.modules:
            return imp.target
        if imp.base in self.modules:
            return imp.base
        return None


@functools.cache
def build_graph(package: str = PACKAGE, type_checking: bool = False) -> Graph:
    """The package's import graph (built once per package and kind: the tests only read it)."""
    modules = package_modules(package)
    root = modules[package].parent.parent
    graph = Graph(root, modules, {m: {} for m in modules}, {m: [] for m in modules})
    for module, path in modules.items():
        source = path.read_text(encoding="utf-8")
        for imp in imports_of(source, module, path.name == "__init__.py", type_checking):
            graph.external[module].append((imp.target, imp.line))
            graph.external[module].append((imp.base, imp.line))
            target = graph.resolve(imp)
            if target is not None and target != module:
                graph.edges[module].setdefault(target, imp.line)
    return graph


def find_cycles(edges: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """One cycle (``[a, b, a]``) for each strongly connected component that has one.

    Tarjan's algorithm, iterative; each component of two or more modules (or one
    that imports itself) is reported as the shortest cycle through its first
    member, found breadth-first inside the component.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    nodes = sorted(set(edges) | {t for ts in edges.values() for t in ts})

    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, iter(sorted(edges.get(root, ())))))
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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
                    components.append(sorted(component))

    cycles = []
    for component in sorted(components):
        start = component[0]
        if len(component) == 1 and start not in edges.get(start, ()):
            continue
        members = set(component)
        came_from: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for node in frontier:
                for child in sorted(edges.get(node, ())):
                    if child == start:
                        found = node
                        break
                    if child in members and child not in came_from:
                        came_from[child] = node
                        nxt.append(child)
                if found is not None:
                    break
            frontier = nxt
        assert found is not None, component  # a strongly connected component has a cycle
        path = [found]
        while path[-1] != start:
            path.append(came_from[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles


def where(graph: Graph, module: str, line: int) -> str:
    return f"{graph.modules[module].relative_to(graph.root)}:{line}"


def describe(cycle: list[str], graph: Graph) -> str:
    steps = [
        f"{a} -> {b} ({where(graph, a, graph.edges[a][b])})" for a, b in itertools.pairwise(cycle)
    ]
    return " -> ".join(cycle) + "\n    " + "\n    ".join(steps)


# --- the cycle finder itself, so the real check cannot pass vacuously -------------------


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert find_cycles({"a": ["b"], "b": ["a"]}) == [["a", "b", "a"]]
    assert find_cycles({"a": ["b"], "b": []}) == []
    assert find_cycles({}) == []
    assert find_cycles({"a": ["a"]}) == [["a", "a"]]
    # a diamond is no cycle; a tail into a three-cycle is reported by the cycle alone
    assert find_cycles({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}) == []
    tail = {"t": ["x"], "x": ["y"], "y": ["z"], "z": ["x", "w"], "w": []}
    assert find_cycles(tail) == [["x", "y", "z", "x"]]
    # two separate cycles, both reported
    two = {"a": ["b"], "b": ["a", "c"], "c": ["d"], "d": ["c"]}
    assert find_cycles(two) == [["a", "b", "a"], ["c", "d", "c"]]


def test_imports_are_read_as_python_runs_them() -> None:
    source = """
from typing import TYPE_CHECKING
import gateway.session.hub
from . import hub, helpers
from ..http import websocket
from .session import Session
if TYPE_CHECKING:
    from gateway.app import Gateway
else:
    from gateway.config import Config
def later():
    from gateway.session.agent import AgentLoop
"""
    found = {(i.target, i.base) for i in imports_of(source, "gateway.session.turn", False)}
    assert found == {
        ("typing.TYPE_CHECKING", "typing"),
        ("gateway.session.hub", "gateway.session.hub"),
        ("gateway.session.hub", "gateway.session"),
        ("gateway.session.helpers", "gateway.session"),
        ("gateway.http.websocket", "gateway.http"),
        ("gateway.session.session.Session", "gateway.session.session"),
        ("gateway.config.Config", "gateway.config"),
        ("gateway.session.agent.AgentLoop", "gateway.session.agent"),
    }
    # in a package's __init__, "." is the package itself
    [imp] = imports_of("from .hub import Hub", "gateway.session", True)
    assert imp.base == "gateway.session.hub"


def test_the_walk_sees_the_whole_package() -> None:
    graph = build_graph()
    assert {"gateway", "gateway.cli", "gateway.config"} <= set(graph.modules)
    for layer in ("gateway.session", "gateway.http", "gateway.protocol"):
        assert sum(m.startswith(layer + ".") for m in graph.modules) >= 2, layer
    assert sum(len(targets) for targets in graph.edges.values()) > 30
    assert all(path.is_file() for path in graph.modules.values())


# --- the rules ----------------------------------------------------------------------------


def test_no_import_cycle_in_gateway() -> None:
    graph = build_graph()
    cycles = find_cycles(graph.edges)
    assert not cycles, "import cycles in gateway/:\n" + "\n".join(
        describe(c, graph) for c in cycles
    )


def test_no_import_cycle_for_the_type_checker_either() -> None:
    """``if TYPE_CHECKING:`` imports count here: the module map a reader draws has no loop.

    A part that needs what owns it sees it through a Protocol of a module below
    both (gateway.node.core, gateway.session.core), never by naming the owner.
    """
    graph = build_graph(type_checking=True)
    cycles = find_cycles(graph.edges)
    assert not cycles, "import cycles in gateway/, TYPE_CHECKING imports counted:\n" + "\n".join(
        describe(c, graph) for c in cycles
    )


def test_the_agent_loop_names_no_runtime() -> None:
    """The loop gets a runtime from :func:`gateway.runtimes.factory`; no session module names one.

    A runtime sees the loop through :mod:`gateway.session.loop_api` only.
    """
    graph = build_graph(type_checking=True)
    runtime_modules = {m for m in graph.modules if m.startswith("gateway.runtimes.")}
    wrong = [
        f"{module} -> {target} ({where(graph, module, line)})"
        for module, targets in sorted(graph.edges.items())
        if module.startswith("gateway.session.")
        for target, line in sorted(targets.items())
        if target in runtime_modules
    ]
    wrong += [
        f"{module} -> {target} ({where(graph, module, line)})"
        for module in sorted(runtime_modules)
        for target, line in sorted(graph.edges[module].items())
        if target in ("gateway.session.agent", "gateway.session.session")
    ]
    assert not wrong, "the agent loop and its runtimes import each other:\n" + "\n".join(wrong)


def test_node_and_session_import_no_door_and_no_transport() -> None:
    graph = build_graph(type_checking=True)
    above = ("gateway.doors", "gateway.http", "gateway.app")
    wrong = [
        f"{module} -> {target} ({where(graph, module, line)})"
        for module, targets in sorted(graph.edges.items())
        if _under(module, "gateway.node") or _under(module, "gateway.session")
        for target, line in sorted(targets.items())
        if any(_under(target, name) for name in above)
    ]
    assert not wrong, "gateway/node/ or gateway/session/ import a door or HTTP:\n" + "\n".join(
        wrong
    )


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_gateway_uses_no_test_machinery() -> None:
    """No ``trio.testing`` (imported or reached as ``trio.testing.x``) and no ``tests``."""
    graph = build_graph()
    wrong = [
        f"{where(graph, module, line)}: imports {name}"
        for module, names in sorted(graph.external.items())
        for name, line in sorted(set(names))
        if _under(name, "trio.testing") or _under(name, "tests")
    ]
    for module, path in sorted(graph.modules.items()):
        source = path.read_text(encoding="utf-8")
        uses = attribute_uses(source, "trio.testing")
        wrong += [f"{where(graph, module, line)}: uses trio.testing" for line in uses]
    assert not wrong, "\n".join(wrong)


# The HTTP API's modules, lowest floor first: a module imports none on a floor above
# its own. The router is given the doors' routes (by gateway.app), so it stays below
# the doors' context, the handlers that use it and the tables that name them.
HTTP_API_FLOORS: tuple[tuple[str, ...], ...] = (
    ("gateway.http.openapi", "gateway.http.parsing"),
    ("gateway.http.router",),
    ("gateway.doors.context",),
    ("gateway.doors.rest.admin", "gateway.doors.rest.sessions", "gateway.doors.rest.turns"),
    ("gateway.doors.rest.door",),
    ("gateway.app",),
)


def _floor(module: str) -> int | None:
    for i, floor in enumerate(HTTP_API_FLOORS):
        if any(_under(module, name) for name in floor):
            return i
    return None


def test_the_http_api_imports_only_downwards() -> None:
    graph = build_graph()
    assert all(
        any(_under(m, name) for m in graph.modules) for floor in HTTP_API_FLOORS for name in floor
    )
    wrong = []
    for module, targets in sorted(graph.edges.items()):
        low = _floor(module)
        for target, line in sorted(targets.items()):
            high = _floor(target)
            if low is not None and high is not None and high > low:
                wrong.append(f"{where(graph, module, line)}: imports {target}, a floor above")
    assert not wrong, "\n".join(wrong)


# --- the layers of gateway/, as docs/architecture.md draws them --------------------------

LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__.py",),
    ("cli.py",),
    ("app.py",),
    ("doors/",),
    ("node/",),
    ("webhooks/",),
    ("runtimes/",),
    ("session/",),
    ("mcp/",),
    ("tools/", "translate.py"),
    ("providers/",),
    ("http/",),
    ("client/", "store/", "agents.py", "environment.py"),
    ("tenancy.py", "telemetry.py", "logs.py", "media.py", "cluster/", "ui/"),
    ("config.py",),
    ("protocol/",),
    ("errors.py", "ids.py", "metrics.py", "partial_json.py"),
)
"""docs/architecture.md's "Layers", from the top: each row's entries (a folder, ``name/``,
or a module, ``name.py``, under gateway/) import only their own modules and the rows below."""


def entry_module(entry: str) -> str:
    """The dotted name an entry of the table stands for: ``doors/`` is ``gateway.doors``."""
    return ".".join([PACKAGE, *entry.removesuffix("/").removesuffix(".py").split("/")])


def layer_of(module: str) -> tuple[int, str] | None:
    """The row and entry of the table a module belongs to: the longest entry naming it."""
    found = [
        (len(entry_module(entry)), row, entry)
        for row, entries in enumerate(LAYERS)
        for entry in entries
        if _under(module, entry_module(entry))
    ]
    if not found:
        return None
    _, row, entry = max(found)
    return row, entry


def layer_violations(graph: Graph) -> list[str]:
    """Every import of a module beside its own row or above it, with where it is."""
    wrong = []
    for module, targets in sorted(graph.edges.items()):
        placed = layer_of(module)
        if placed is None:
            continue
        row, entry = placed
        for target, line in sorted(targets.items()):
            target_row, target_entry = layer_of(target) or (len(LAYERS), "")
            if target_entry != entry and target_row <= row:
                side = "a layer above" if target_row < row else "its own layer"
                wrong.append(
                    f"{where(graph, module, line)}: {module} ({entry}) imports "
                    f"{target} ({target_entry}), {side}"
                )
    return wrong


def test_every_module_is_in_a_layer_and_every_entry_names_some() -> None:
    graph = build_graph()
    unplaced = [m for m in sorted(graph.modules) if m != PACKAGE and layer_of(m) is None]
    assert not unplaced, "modules of no layer (docs/architecture.md, Layers):\n" + "\n".join(
        unplaced
    )
    empty = [
        e
        for row in LAYERS
        for e in row
        if not any(_under(m, entry_module(e)) for m in graph.modules)
    ]
    assert not empty, f"entries that name no module: {empty}"


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """``if TYPE_CHECKING:`` imports included: the picture a reader draws has no arrow up."""
    wrong = layer_violations(build_graph(type_checking=True))
    assert not wrong, "imports beside or up a layer:\n" + "\n".join(wrong)


def test_the_layer_check_finds_an_import_up() -> None:
    graph = Graph(
        Path("/"),
        {
            "gateway.node.x": Path("/gateway/node/x.py"),
            "gateway.doors.y": Path("/gateway/doors/y.py"),
        },
        {"gateway.node.x": {"gateway.doors.y": 3}, "gateway.doors.y": {"gateway.node.x": 1}},
        {},
    )
    [found] = layer_violations(graph)
    assert found == (
        "gateway/node/x.py:3: gateway.node.x (node/) imports gateway.doors.y (doors/), "
        "a layer above"
    )


def docs_layers() -> tuple[tuple[str, ...], ...]:
    """The first column of docs/architecture.md's "Layers" table: each row's entries."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return tuple(tuple(re.findall(r"`([^`]+)`", cell)) for cell in rows)


def test_the_layers_are_the_docs() -> None:
    assert docs_layers() == LAYERS, "docs/architecture.md's Layers table and LAYERS differ"
