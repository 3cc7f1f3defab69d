"""The house rules of bcer's imports, over every module (module-level and function-local imports
alike): each top-level part of the package may import only the parts below it, the libraries
below the engine never import Ray, and no modules import each other round a circle."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "bcer"
BELOW_TOOLS = {"contracts", "metrics", "optional"}
# part -> the parts it may import (its own part always); a new part needs a rule here
ALLOWED: dict[str, set[str]] = {
    "contracts": set(),
    "metrics": {"contracts"},
    "options": {"contracts"},
    "optional": {"contracts"},
    "io": {"contracts"},  # readers and writers of formats: below everything else
    "tools": BELOW_TOOLS | {"io"},
    "memory": BELOW_TOOLS | {"io"},
    "datasets": BELOW_TOOLS | {"io", "tools"},
    "pages": BELOW_TOOLS | {"io", "tools"},
    "overrides": BELOW_TOOLS | {"tools"},
    "engine": BELOW_TOOLS | {"io", "tools", "datasets"},
    "progress": BELOW_TOOLS | {"engine"},
    "agents": BELOW_TOOLS | {"io", "tools", "datasets", "engine", "memory"},
    "bench": BELOW_TOOLS | {"io", "tools", "datasets", "engine", "memory", "agents", "api", "options", "overrides",
                            "pages", "progress"},
    "api": BELOW_TOOLS | {"io", "tools", "datasets", "engine", "memory", "agents", "options", "pages", "overrides",
                          "progress"},
    "cli": BELOW_TOOLS | {"io", "tools", "datasets", "engine", "memory", "agents", "api", "bench", "options", "pages",
                          "overrides", "progress"},
}
NO_RAY = {"contracts", "metrics", "optional", "options", "io", "tools", "memory", "datasets", "pages", "overrides"}


@lru_cache(maxsize=1)
def _modules() -> dict[str, Path]:
    return {".".join(f.relative_to(PKG.parent).with_suffix("").parts): f for f in PKG.rglob("*.py")}


@lru_cache(maxsize=None)
def _imports(name: str) -> frozenset[str]:
    """Absolute names of everything module ``name`` imports (relative imports resolved)."""
    path = _modules()[name]
    here = name.split(".")[:-1] if not name.endswith("__init__") else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}
    return frozenset(found)


def _part(name: str) -> str:
    return name.split(".")[1]


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The module file an import names (the longest prefix that is a module, not a package)."""
    while name:
        if name in mods and not name.endswith("__init__"):
            return name
        if name + ".__init__" in mods:
            return None
        name = name.rpartition(".")[0]
    return None


PARTS = sorted({_part(m) for m in _modules() if m.count(".") >= 1 and not m.endswith("bcer.__init__")})


@pytest.mark.parametrize("part", PARTS)
def test_each_part_imports_only_the_parts_below_it(part):
    assert part in ALLOWED, f"bcer.{part} has no layering rule: add one to tests/test_layering.py"
    allowed = ALLOWED[part] | {part}
    bad = {}
    for name in _modules():
        if name.count(".") < 1 or _part(name) != part:
            continue
        wrong = sorted(m for m in _imports(name) if m.startswith("bcer.") and m != "bcer.__version__"
                       and _part(m) not in allowed)
        if part in NO_RAY:
            wrong += sorted(m for m in _imports(name) if m == "ray" or m.startswith("ray."))
        if wrong:
            bad[name] = wrong
    assert not bad, f"imports against the layering rules: {bad}"


def test_no_import_circles():
    mods = {m: p for m, p in _modules().items() if not m.endswith("__init__")}
    graph = {m: {r for i in _imports(m) if (r := _resolve(i, _modules())) and r != m} for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for m in graph:
        if m not in index:
            visit(m)
    assert circles == [], f"modules that import each other round a circle: {circles}"
