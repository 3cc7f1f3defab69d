"""Dataset layouts: one module each, exposing ``NAME``, ``detect(root) -> bool``,
``write(phantoms, out) -> list[Case]`` and ``read(root) -> list[Case]``.

Modules are discovered, so adding a layout needs no edit here.
"""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from ...contracts.errors import ErrorCode, ToolError, did_you_mean


def layouts() -> dict[str, ModuleType]:
    found = {}
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            mod = importlib.import_module(f"{__name__}.{m.name}")
            found[getattr(mod, "NAME", m.name)] = mod
    return found


def get_layout(name: str) -> ModuleType:
    all_ = layouts()
    if name not in all_:
        raise ToolError(ErrorCode.schema, f"unknown dataset layout {name!r}", hint=did_you_mean(name, all_))
    return all_[name]


def detect_layout(root: str | Path) -> str:
    """Name of the first layout whose ``detect`` accepts ``root``."""
    root = Path(root)
    if not root.exists():
        raise ToolError(ErrorCode.input_missing, f"dataset folder not found: {root}", file=str(root))
    for name, mod in sorted(layouts().items()):
        if mod.detect(root):
            return name
    raise ToolError(ErrorCode.schema, f"cannot tell the layout of {root}",
                    hint=f"name it with --layout; known: {sorted(layouts())}", file=str(root))


def read_dataset(root: str | Path, layout: str | None = None, strict: bool = False):
    """Read every case under ``root`` (layout detected unless named).

    With ``strict=False`` (cohorts) a case that fails its header checks is kept with its typed
    error in ``Case.issues``, so it becomes a rejected row while the others run.
    """
    from ._common import lenient_read

    mod = get_layout(layout or detect_layout(root))
    if strict:
        return mod.read(Path(root))
    with lenient_read():
        return mod.read(Path(root))
