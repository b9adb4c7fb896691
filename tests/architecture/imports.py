"""The import graph of ``stream_dp``, read from the source with ``ast``.

Every ``import`` and ``from ... import`` counts wherever it is written: at the top of a module,
inside a function (a lazy import), or under ``if TYPE_CHECKING:``. A lazy import still ties the
two packages together (one cannot be understood, moved or tested without the other), so the
architecture tests treat it like any other. ``importlib.import_module("stream_dp...")`` with a
literal name counts too.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "stream_dp"


@dataclass(frozen=True)
class Import:
    """One import statement: the module that wrote it, where, and the module it names."""

    importer: str  # dotted module name, e.g. stream_dp.windows.partial
    path: str  # relative to the repository, e.g. stream_dp/windows/partial.py
    line: int
    imported: str  # dotted module name, e.g. stream_dp.dp.local


def module_paths(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (``pkg/__init__.py`` is ``pkg``)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _named_modules(node: ast.AST, importer: str, is_package: bool, known: set[str]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        target = node.module or ""
        if node.level:
            target = _resolve_relative(importer, is_package, node.level, node.module)
        yield target
        for alias in node.names:  # `from stream_dp import dp` imports the module stream_dp.dp
            if f"{target}.{alias.name}" in known:
                yield f"{target}.{alias.name}"
    elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
          and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
          and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        yield node.args[0].value


def package_imports(root: Path = ROOT, package: str = PACKAGE) -> list[Import]:
    """Every import of a module of the package by a module of the package."""
    modules = module_paths(root, package)
    known = set(modules)
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):  # every depth: function bodies and TYPE_CHECKING blocks too
            for imported in _named_modules(node, name, path.name == "__init__.py", known):
                if imported == package or imported.startswith(package + "."):
                    found.append(Import(name, path.relative_to(root).as_posix(), node.lineno, imported))
    return found


def unit_of(module: str, prefix: str) -> str | None:
    """The unit a module belongs to under ``prefix``: ``prefix.<next name>``, or ``prefix`` itself
    for the package's own ``__init__``; None for a module outside ``prefix``."""
    if module == prefix:
        return prefix
    if not module.startswith(prefix + "."):
        return None
    return f"{prefix}.{module[len(prefix) + 1:].split('.')[0]}"


def unit_edges(imports: Iterable[Import], prefix: str) -> dict[tuple[str, str], list[Import]]:
    """Imports from one unit under ``prefix`` to another, by (importing unit, imported unit)."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for found in imports:
        source, target = unit_of(found.importer, prefix), unit_of(found.imported, prefix)
        if source and target and source != target:
            edges[source, target].append(found)
    return dict(edges)


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected group of two or more units, each as the
    list of its units in import order (the first unit repeated at the end)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    found = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            found.append(min((_shortest_cycle(graph, start, group) for start in sorted(group)), key=len))
    return sorted(found)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    nodes = sorted(set(graph) | {target for targets in graph.values() for target in targets})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graphs here are a few dozen nodes deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            groups.append(group)

    for node in nodes:
        if node not in index:
            visit(node)
    return groups


def _shortest_cycle(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first inside the group, back to start
        following = []
        for node in frontier:
            for target in sorted(graph.get(node, ())):
                if target == start:
                    return paths[node] + [start]
                if target in group and target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected group but on no cycle")


def describe(cycle: list[str], edges: dict[tuple[str, str], list[Import]]) -> str:
    """A cycle as its units and, for each step, the files and lines whose imports make it."""
    lines = [" -> ".join(cycle)]
    for source, target in zip(cycle, cycle[1:]):
        lines.append(f"  {source} -> {target}:")
        lines.extend(f"    {found.path}:{found.line} imports {found.imported}" for found in edges[source, target])
    return "\n".join(lines)
