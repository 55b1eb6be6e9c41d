"""Every import cycle among oncely's modules, at runtime and with TYPE_CHECKING imports.

`lint-imports` forbids cycles between the sibling modules of a package; this also finds the
cycles through a package's own `__init__` (a package that imports its submodules while they
import from it), module by module and between top-level units. Exit code 1 if any exists.
Run it with the source you mean on the path: `PYTHONPATH=src python .ci/import_cycles.py`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import grimp


def cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def report(graph: grimp.ImportGraph, name: Callable[[str], str]) -> list[list[str]]:
    edges: dict[str, set[str]] = {}
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = name(module), name(imported)
            if a != b:
                edges.setdefault(a, set()).add(b)
    return cycles({name(m) for m in graph.modules}, edges)


def main() -> int:
    found = False
    for label, exclude in (("with TYPE_CHECKING imports", False), ("at runtime", True)):
        # No cache: grimp's keeps a module's imports across edits that leave its size and
        # modification time looking unchanged (a rewritten import line), and a stale graph
        # would report a cycle that is gone, or miss a new one.
        graph = grimp.build_graph("oncely", exclude_type_checking_imports=exclude, cache_dir=None)
        for level, name in (
            ("top-level units", lambda m: ".".join(m.split(".")[:2])),
            ("modules", lambda m: m),
        ):
            components = report(graph, name)
            found = found or bool(components)
            print(f"{label}, {level}: {len(components)} cycle(s)")
            for component in components:
                print("  each imports the others, directly or not: " + ", ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
