"""The proxy package's import graph, read from the source: arrows, circles, levels, and imports hidden in functions.

`python -m tests.import_graph` prints the figures.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "proxy"
# The public API is imported lazily (PEP 562) so that `import proxy` stays light: a deliberate deferral, no circle.
LAZY_EXPORTS = "__init__"


@dataclass(frozen=True)
class Module:
    name: str
    imports: frozenset[str]  # proxy modules it imports, anywhere in it
    external: frozenset[str]  # top-level names of the other packages it imports
    deferred: tuple[tuple[int, str], ...] = field(default=())  # (line, module) of proxy imports inside a function


def _imports(tree: ast.AST) -> Iterator[tuple[ast.AST, list[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "proxy" else [f"proxy.{alias.name}" for alias in node.names]
            yield node, names
        elif isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]


def _inside_functions(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit in a function's body."""
    found: set[int] = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            found |= {id(node) for node in ast.walk(function) if isinstance(node, ast.Import | ast.ImportFrom)}
    return found


def read(path: Path) -> Module:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    local, external, deferred = set(), set(), []
    in_functions = _inside_functions(tree)
    for node, names in _imports(tree):
        for name in names:
            if name.startswith("proxy."):
                target = name.split(".")[1]
                local.add(target)
                if id(node) in in_functions:
                    deferred.append((getattr(node, "lineno", 0), target))
            elif name != "proxy":
                external.add(name.split(".")[0])
    return Module(path.stem, frozenset(local - {path.stem}), frozenset(external), tuple(deferred))


@cache
def modules() -> dict[str, Module]:
    return {path.stem: read(path) for path in sorted(PACKAGE.glob("*.py"))}


def circles(graph: dict[str, Module]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root].imports)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None and child in graph:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child].imports))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if child is not None:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def levels(graph: dict[str, Module]) -> int:
    """The longest chain of imports (modules on it); meaningful only without circles."""
    depth: dict[str, int] = {}

    def level(name: str) -> int:
        if name not in depth:
            depth[name] = 0  # a circle stops here
            depth[name] = 1 + max((level(child) for child in graph[name].imports if child in graph), default=0)
        return depth[name]

    return max((level(name) for name in graph if name != LAZY_EXPORTS), default=0)


def reaches(graph: dict[str, Module], start: str) -> set[str]:
    """Every proxy module `start` loads, itself included."""
    seen, pending = {start}, [start]
    while pending:
        for child in graph[pending.pop()].imports:
            if child in graph and child not in seen:
                seen.add(child)
                pending.append(child)
    return seen


def main() -> None:
    graph = {name: module for name, module in modules().items() if name != LAZY_EXPORTS}
    arrows = sum(len(module.imports) for module in graph.values())
    print(f"modules {len(graph)}, arrows {arrows}, circles {len(circles(graph))}, levels {levels(graph)}")
    deferred = [(name, line, target) for name, module in graph.items() for line, target in module.deferred]
    print(f"imports deferred into functions: {len(deferred)}")
    for name, line, target in deferred:
        print(f"  proxy/{name}.py:{line} imports proxy.{target}")


if __name__ == "__main__":
    main()
