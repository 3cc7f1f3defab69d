"""Tools registered outside bcer (plugins, a user's module), as the Reflector actors load them.

An actor is handed {module: file} and imports each module itself, by name, else by file (as a
node task does, ``bcer.engine.noderun.import_tool_module``). A pickled registry would need
every module importable by name in the actor's worker, which holds only the folder that
worker started in: a user's tools in another folder killed the actor.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)


def plugin_modules() -> dict[str, str] | None:
    """None when every registered tool ships with bcer; else {module: file} of the modules
    that registered the others."""
    from ...tools.registry import REGISTRY, load_all

    load_all()
    mods = sorted({reg.fn.__module__ for reg in REGISTRY.values() if not reg.fn.__module__.startswith("bcer.")})
    return {m: str(getattr(sys.modules.get(m), "__file__", "") or "") for m in mods} or None


def import_plugins(modules: Mapping[str, str]) -> None:
    """Import the driver's plugin tool modules here (a script's ``__main__`` cannot be)."""
    if not modules:
        return
    from ...engine.noderun import import_tool_module

    for module, file in modules.items():
        if module == "__main__":
            log.warning("tools defined in a script (__main__) cannot be loaded by the reflector: define them "
                        "in an importable module")
            continue
        import_tool_module(module, file)


__all__ = ["import_plugins", "plugin_modules"]
