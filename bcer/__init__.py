"""bcer: long, planned MRI analysis workflows on Ray, from one case to cohorts.

The public surface is small; heavy modules load on first use.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Case", "CaseResult", "Cine", "Classification", "ErrorCode", "Finding", "Findings", "Image", "KSpace", "Mask",
           "PlanSketch", "PlanStep", "Report", "Resources", "Study", "StudyOptions", "Table", "ToolError", "Transform",
           "__version__", "build_pages", "call_tool", "from_nibabel", "from_sitk", "list_contracts", "list_tools", "load_cases",
           "load_contract", "plan_case", "run_case", "to_nibabel", "to_sitk", "tool"]

_LAZY = {
    # running studies
    "Study": "bcer.api", "StudyOptions": "bcer.options", "run_case": "bcer.api", "plan_case": "bcer.api", "load_cases": "bcer.api",
    "CaseResult": "bcer.api", "build_pages": "bcer.api",
    "Case": "bcer.contracts", "load_contract": "bcer.contracts", "list_contracts": "bcer.contracts",
    "PlanSketch": "bcer.contracts", "PlanStep": "bcer.contracts",
    # writing tools: the decorator, the artifact types, the error, resources, conversions
    "tool": "bcer.tools.registry", "call_tool": "bcer.tools.registry", "list_tools": "bcer.tools.registry",
    "Image": "bcer.contracts", "Cine": "bcer.contracts", "Mask": "bcer.contracts", "Table": "bcer.contracts",
    "Classification": "bcer.contracts", "Finding": "bcer.contracts", "Findings": "bcer.contracts",
    "Transform": "bcer.contracts", "Report": "bcer.contracts", "KSpace": "bcer.contracts",
    "ToolError": "bcer.contracts", "ErrorCode": "bcer.contracts", "Resources": "bcer.contracts",
    "to_sitk": "bcer.tools.convert", "from_sitk": "bcer.tools.convert",
    "to_nibabel": "bcer.tools.convert", "from_nibabel": "bcer.tools.convert",
}
assert set(_LAZY) | {"__version__"} == set(__all__), "public names out of sync"


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bcer' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
