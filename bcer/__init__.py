"""bcer: long, planned MRI analysis workflows on Ray, from one case to cohorts.

The public surface is small; heavy modules load on first use.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Case", "Study", "__version__", "list_contracts", "load_cases", "load_contract",
           "plan_case", "run_case"]

_LAZY = {
    "Case": "bcer.contracts",
    "load_contract": "bcer.contracts",
    "list_contracts": "bcer.contracts",
    "Study": "bcer.api",
    "run_case": "bcer.api",
    "plan_case": "bcer.api",
    "load_cases": "bcer.api",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bcer' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
