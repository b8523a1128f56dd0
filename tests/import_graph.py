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

# The layers, top to bottom: a module may import its own layer and any layer ranked below it, never above. The
# three in the middle are siblings (rank 4): none of them imports another.
SHELL = frozenset({"__init__", "__main__", "app", "cli", "reload", "workers"})  # proxy/: starts and holds the rest
RANKS = {"shell": 8, "http": 6, "compaction": 5, "summarizer": 4, "dialects": 4, "store": 4, "upstream": 3, "core": 2,
         "base": 1}
# proxy/'s other modules are the base every layer may use: settings, errors, metrics, the header contract, the
# request's context, logging filters and the off-loop helper. They import only each other.


@dataclass(frozen=True)
class Module:
    name: str
    imports: frozenset[str]  # proxy modules it imports, anywhere in it
    external: frozenset[str]  # top-level names of the other packages it imports
    deferred: tuple[tuple[int, str], ...] = field(default=())  # (line, module) of proxy imports inside a function
    web: bool = False  # imports aiohttp's server side (aiohttp.web)


def _targets(node: ast.AST, known: frozenset[str]) -> list[str]:
    """The proxy modules one import statement names, dotted below `proxy` ("core.budget", "app")."""
    if isinstance(node, ast.Import):
        return [alias.name.removeprefix("proxy.") for alias in node.names if alias.name.startswith("proxy.")]
    if not isinstance(node, ast.ImportFrom) or node.level != 0 or not node.module:
        return []
    if node.module != "proxy" and not node.module.startswith("proxy."):
        return []
    package = node.module.removeprefix("proxy").removeprefix(".")
    # `from proxy.core import budget` imports a module; `from proxy.core.budget import Budget` a name of one.
    found = [f"{package}.{alias.name}".lstrip(".") for alias in node.names]
    return [name for name in found if name in known] or ([package] if package in known else [])


def _externals(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
    return found - {"proxy"}


def _imports_web(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("aiohttp.web") or (node.module == "aiohttp"
                                                         and any(alias.name == "web" for alias in node.names)):
                return True
        elif isinstance(node, ast.Import) and any(alias.name.startswith("aiohttp.web") for alias in node.names):
            return True
    return False


def _inside_functions(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit in a function's body."""
    found: set[int] = set()
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            found |= {id(node) for node in ast.walk(function) if isinstance(node, ast.Import | ast.ImportFrom)}
    return found


def name_of(path: Path) -> str:
    """A source file's module name below `proxy`: "core.budget", "app", "core" for a folder's __init__."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def read(path: Path, known: frozenset[str]) -> Module:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = name_of(path)
    local, deferred = set(), []
    in_functions = _inside_functions(tree)
    for node in ast.walk(tree):
        for target in _targets(node, known):
            local.add(target)
            if id(node) in in_functions:
                deferred.append((getattr(node, "lineno", 0), target))
    return Module(name, frozenset(local - {name}), frozenset(_externals(tree)), tuple(deferred), _imports_web(tree))


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@cache
def modules() -> dict[str, Module]:
    known = frozenset(name_of(path) for path in sources())
    return {name_of(path): read(path, known) for path in sources()}


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


def layer(name: str) -> str:
    """The layer a module belongs to: its folder, or "shell" / "base" for the modules directly in proxy/."""
    folder, dot, _ = name.partition(".")
    if dot or folder in RANKS:
        return folder
    return "shell" if name in SHELL else "base"


def upward(graph: dict[str, Module]) -> list[str]:
    """Every arrow that points up or sideways between layers, as "importer -> imported"."""
    return [f"{name} -> {target}" for name, module in sorted(graph.items()) for target in sorted(module.imports)
            if target in graph and layer(name) != layer(target) and RANKS[layer(name)] <= RANKS[layer(target)]]


def folder_arrows(graph: dict[str, Module]) -> dict[tuple[str, str], int]:
    """How many arrows go from each layer to each other layer."""
    counted: dict[tuple[str, str], int] = {}
    for name, module in graph.items():
        for target in module.imports:
            if target in graph and layer(target) != layer(name):
                key = (layer(name), layer(target))
                counted[key] = counted.get(key, 0) + 1
    return counted


def main() -> None:
    graph = {name: module for name, module in modules().items() if name != LAZY_EXPORTS}
    arrows = sum(len(module.imports) for module in graph.values())
    print(f"modules {len(graph)}, arrows {arrows}, circles {len(circles(graph))}, levels {levels(graph)}")
    deferred = [(name, line, target) for name, module in graph.items() for line, target in module.deferred]
    print(f"imports deferred into functions: {len(deferred)}")
    for name, line, target in deferred:
        print(f"  proxy.{name}:{line} imports proxy.{target}")
    print(f"arrows pointing up or sideways: {len(upward(graph))}")
    for arrow in upward(graph):
        print(f"  {arrow}")
    print("layer -> the layers it imports (arrows)")
    counted = folder_arrows(graph)
    for source in sorted(RANKS, key=lambda name: -RANKS[name]):
        targets = sorted((target for (origin, target) in counted if origin == source), key=lambda name: -RANKS[name])
        print(f"  {source:<11} -> " + ", ".join(f"{target} ({counted[source, target]})" for target in targets))


if __name__ == "__main__":
    main()
