"""The memory library and the report writing code stay below the engine: no ray, no engine,
no actors (DESIGN: tools/memory never import ray or the engine). (``engine/review.py`` holds
the reviewer protocol so the engine need not import the R4 actors.)"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "bcer"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
    return out


@pytest.mark.parametrize("folder,banned", [
    ("memory", ("ray", "..engine", "..actors", "bcer.engine", "bcer.actors")),
    ("tools/reporting", ("ray", "...engine", "...actors", "bcer.engine", "bcer.actors")),
])
def test_layers_point_down(folder, banned):
    for path in (PKG / folder).rglob("*.py"):
        bad = [m for m in _imports(path) if any(m == b or m.startswith(b + ".") for b in banned)]
        assert not bad, f"{path.relative_to(PKG)} imports {bad}"
