"""The table of phantom generators for the acquisition families other than ``base``.

``cardiac.make_cardiac`` and ``prostate.make_prostate`` build the ``base`` family themselves and
look every other family up here. The family modules (``cardiac_family``, ``prostate_family``)
put their builder in this table when they are imported, which the package does on import: a
generator module therefore never imports the family modules that are built on it.
"""
from __future__ import annotations

from typing import Any, Callable

from ..contracts.errors import ErrorCode, ToolError

_BUILDERS: dict[str, Callable[..., Any]] = {}


def register_family_builder(domain: str, builder: Callable[..., Any]) -> Callable[..., Any]:
    """Put the builder of ``domain``'s non-base families in the table (returns it unchanged)."""
    _BUILDERS[domain] = builder
    return builder


def family_builder(domain: str) -> Callable[..., Any]:
    """The builder of ``domain``'s non-base families.

    Raises:
        ToolError: ``internal`` when no module registered one (the package was not imported).
    """
    try:
        return _BUILDERS[domain]
    except KeyError:
        raise ToolError(ErrorCode.internal, f"no family generator registered for {domain!r}",
                        hint="import bcer.datasets (it registers the family generators)") from None


__all__ = ["family_builder", "register_family_builder"]
