"""No import cycle among deltaserve's modules (parsed, nothing imported). At top level a cycle makes the import order
matter (a module half-initialised when another reads it); through an import inside a function it still means two
modules each need the other, so neither owns its job. Both graphs are checked: top-level imports must have no
cycle at all, all imports none but the KNOWN ones below (each a debt with its reason, to be paid, never added to)."""

from __future__ import annotations

import ast
from pathlib import Path

import deltaserve

ROOT = Path(deltaserve.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# Cycles through function-level imports, each to be broken (the test fails on any other):
KNOWN: set[frozenset] = set()  # cycles known and accepted (pairs): none


def imports(path: Path, modules: set[str], top_level: bool) -> set[str]:
    """The deltaserve modules `path` imports, at its top level only (an `if` / `try` block at top level included)
    or anywhere; `from pkg import name` counts pkg.name where that is a module, else pkg."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    body = list(tree.body) if top_level else list(ast.walk(tree))
    while body:
        node = body.pop(0)
        if top_level and isinstance(node, (ast.If, ast.Try)):
            body += node.body + getattr(node, "orelse", []) + [n for h in getattr(node, "handlers", []) for n in h.body]
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("deltaserve")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("deltaserve"):
                continue
            subs = {f"{target}.{a.name}" for a in node.names} & modules
            found |= subs or {target}
    return {m for m in found if m in modules and m != name}


def import_graph(top_level: bool = True) -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules, top_level) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_top_level_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_but_the_known_ones():
    graph = import_graph(top_level=False)
    for pair in KNOWN:  # the known cycles cut (each is a pair): any other cycle remains
        a, b = sorted(pair)
        assert b in graph[a] and a in graph[b], f"{a} <-> {b} is no longer a cycle: drop it from KNOWN"
        graph[a].discard(b)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
