"""The import graph of bot/, rules/ and storage/, read with ast: who imports whom, and how.

Each import is resolved to the module it loads (`from pkg import submodule` is the submodule, not
the package's __init__) and classed by where it runs: at import time (`module`), inside a function
(`function`) or only for the type checker (`type_checking`). tests/unit/test_architecture.py
guards the graph; `python -m tests.imports` (or `make imports`) prints the package-level graph,
every cycle (strongly connected component) and the size of each module.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bot", "rules", "storage")
SIZE_LIMIT = 400  # lines: the house style splits a module before it passes this

Kind = Literal["module", "function", "type_checking"]
RUNTIME: frozenset[Kind] = frozenset({"module", "function"})
ALL_KINDS: frozenset[Kind] = frozenset({"module", "function", "type_checking"})


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to a dotted module name."""

    source: str
    target: str
    kind: Kind
    line: int

    @property
    def internal(self) -> bool:
        return self.target.split(".")[0] in PACKAGES


@cache
def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the three packages by dotted name (a package is its __init__.py)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def is_package(name: str, known: Mapping[str, Path]) -> bool:
    return name in known and known[name].name == "__init__.py"


def package_of(name: str, known: Mapping[str, Path]) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    return name if is_package(name, known) else name.rpartition(".")[0]


def _resolve(base: str, name: str, known: Collection[str]) -> str:
    """`from base import name`: the submodule when there is one, else base itself."""
    submodule = f"{base}.{name}" if base else name
    return submodule if submodule in known else base


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, Kind]]:
    """Every import statement with the kind of place it sits in."""

    def walk(node: ast.AST, kind: Kind) -> Iterator[tuple[ast.Import | ast.ImportFrom, Kind]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, kind
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "function" if kind == "module" else kind)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), "type_checking")
                for statement in child.orelse:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, "module")


def imports_of(name: str, source: str, known: Mapping[str, Path]) -> list[Import]:
    """What module `name` (whose text is `source`) imports, internal and external."""
    found: list[Import] = []
    for statement, kind in _statements(ast.parse(source)):
        if isinstance(statement, ast.Import):
            targets = [alias.name for alias in statement.names]
        else:
            if statement.level:
                anchor = package_of(name, known).split(".")
                base_parts = anchor[: len(anchor) - (statement.level - 1)]
                base = ".".join([*base_parts, *([statement.module] if statement.module else [])])
            else:
                base = statement.module or ""
            targets = [_resolve(base, alias.name, known) for alias in statement.names]
        found += [Import(name, target, kind, statement.lineno) for target in targets]
    return list(dict.fromkeys(found))  # one entry per target of each statement


@cache
def all_imports(root: Path = ROOT) -> tuple[Import, ...]:
    known = modules(root)
    return tuple(
        found
        for name, path in known.items()
        for found in imports_of(name, path.read_text(encoding="utf-8"), known)
    )


def graph(imports: Iterable[Import], kinds: Collection[Kind] = RUNTIME) -> dict[str, set[str]]:
    """Module -> the internal modules it imports, counting only imports of the given kinds."""
    edges: dict[str, set[str]] = defaultdict(set)
    for found in imports:
        if found.internal and found.kind in kinds and found.target != found.source:
            edges[found.source].add(found.target)
    return dict(edges)


class _Tarjan:
    """Tarjan's strongly connected components over a graph of names."""

    def __init__(self, edges: Mapping[str, Collection[str]]) -> None:
        self.edges = edges
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.components: list[list[str]] = []

    def visit(self, node: str) -> None:
        self.index[node] = self.low[node] = len(self.index)
        self.stack.append(node)
        self.on_stack.add(node)
        for target in sorted(self.edges.get(node, ())):
            if target not in self.index:
                self.visit(target)
                self.low[node] = min(self.low[node], self.low[target])
            elif target in self.on_stack:
                self.low[node] = min(self.low[node], self.index[target])
        if self.low[node] == self.index[node]:
            self._pop_component(node)

    def _pop_component(self, root: str) -> None:
        component: list[str] = []
        while not component or component[-1] != root:
            component.append(self.stack.pop())
            self.on_stack.discard(component[-1])
        self.components.append(sorted(component))


def cycles(edges: Mapping[str, Collection[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member: the import cycles."""
    nodes = sorted(set(edges) | {t for targets in edges.values() for t in targets})
    tarjan = _Tarjan(edges)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(nodes) + 100))  # one frame per node on a path
    try:
        for node in nodes:
            if node not in tarjan.index:
                tarjan.visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(c for c in tarjan.components if len(c) > 1)


def package_graph(
    imports: Iterable[Import], known: Mapping[str, Path], kinds: Collection[Kind] = RUNTIME
) -> dict[str, Counter[str]]:
    """Package -> the other packages it imports, with how many module-to-module edges each."""
    edges: dict[str, Counter[str]] = defaultdict(Counter)
    for source, targets in graph(imports, kinds).items():
        for target in targets:
            if package_of(source, known) != package_of(target, known):
                edges[package_of(source, known)][package_of(target, known)] += 1
    return dict(edges)


def sizes(known: Mapping[str, Path]) -> dict[str, int]:
    """Lines per module."""
    return {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in known.items()
    }


def main() -> None:
    known = modules()
    imports = all_imports()
    print("package graph (module-level and function-level imports; edges counted per module pair)")
    packages = package_graph(imports, known)
    for package in sorted(packages):
        targets = ", ".join(f"{t} ({n})" for t, n in sorted(packages[package].items()))
        print(f"  {package} -> {targets}")
    package_edges = {source: set(targets) for source, targets in packages.items()}
    for title, edges in (
        ("package cycles", package_edges),
        ("module cycles, module-level + function-level", graph(imports, RUNTIME)),
        ("module cycles, TYPE_CHECKING included", graph(imports, ALL_KINDS)),
    ):
        components = cycles(edges)
        print(f"\n{title}: {len(components) or 'none'}")
        for component in components:
            print("  " + " <-> ".join(component))
    print("\nfunction-level imports between modules of the project")
    for found in imports:
        if found.internal and found.kind == "function":
            print(f"  {found.source}:{found.line} -> {found.target}")
    lines = sizes(known)
    print(f"\nmodule sizes in lines ({len(lines)} modules, {sum(lines.values())} lines)")
    for name, count in sorted(lines.items(), key=lambda item: (-item[1], item[0])):
        over = f"  (over {SIZE_LIMIT})" if count > SIZE_LIMIT else ""
        print(f"  {count:5d}  {name}{over}")


if __name__ == "__main__":
    main()
