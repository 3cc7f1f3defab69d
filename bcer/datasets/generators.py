"""The one table of phantom generators: which function makes each domain's phantoms, the
families a generator may offer, and the builders of the non-base families.

``GENERATORS`` names each domain's generator by module path, resolved on first use, so a missing
or broken generator of one domain never breaks another (and this module imports none of them).
``cardiac.make_cardiac`` and ``prostate.make_prostate`` build the ``base`` family themselves and
look every other family up here. The family modules (``cardiac_family``, ``prostate_family``)
put their builder in this table when they are imported, which the package does on import: a
generator module therefore never imports the family modules that are built on it.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from ..contracts.errors import ErrorCode, ToolError, did_you_mean

# Phantom families every generator may offer (``family=`` keyword): "base" = the original
# phantoms, "randomised" = domain-randomised (tuning/training), "heldout" = other ranges and
# anatomy variants, never tuned on. A generator without the keyword offers "base" only.
FAMILIES = ("base", "randomised", "heldout")

# domain -> "module:function"; every generator is ``(case_id, seed, size, **kw) -> Phantom``.
GENERATORS: dict[str, str] = {
    "brain": "bcer.datasets.brain:make_brain",
    "cardiac": "bcer.datasets.cardiac:make_cardiac",
    "prostate": "bcer.datasets.prostate:make_prostate",
}

_BUILDERS: dict[str, Callable[..., Any]] = {}


def get_generator(domain: str) -> Callable[..., Any]:
    """The phantom generator of ``domain``, imported on first use.

    Raises:
        ToolError: ``value_range`` for an unknown domain, ``resource`` when its module
            cannot be imported.
    """
    if domain not in GENERATORS:
        raise ToolError(ErrorCode.value_range, f"unknown phantom domain {domain!r}",
                        hint=did_you_mean(domain, GENERATORS), arg="domain")
    module, func = GENERATORS[domain].split(":")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ToolError(ErrorCode.resource, f"generator {GENERATORS[domain]} is not available: {e}",
                        arg="domain") from e


def family_kwargs(gen: Callable[..., Any], family: str, what: str = "") -> dict[str, Any]:
    """``{"family": family}`` for a generator that offers it, ``{}`` for "base" (so generators
    without families keep working unchanged).

    Raises:
        ToolError: ``value_range`` for an unknown family, or a non-base family that the
            generator does not offer yet.
    """
    if family not in FAMILIES:
        raise ToolError(ErrorCode.value_range, f"unknown phantom family {family!r}",
                        hint=did_you_mean(family, FAMILIES), arg="family")
    if family == "base":
        return {}
    if "family" not in inspect.signature(gen).parameters:
        name = what or getattr(gen, "__name__", "generator")
        raise ToolError(ErrorCode.value_range, f"{name} has no phantom family {family!r} (base only)",
                        hint="use --family base, or a domain whose generator offers families", arg="family")
    return {"family": family}


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


__all__ = ["FAMILIES", "GENERATORS", "family_builder", "family_kwargs", "get_generator", "register_family_builder"]
