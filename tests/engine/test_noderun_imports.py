"""A GPU-capable tool's frameworks are imported before its time limit is armed (an alarm inside
``import torch`` would poison the worker for every later torch tool); CPU-only tools never
import them, and a tool whose GPU path is cupy (the recon tools) never imports torch. A tool
that runs MONAI bundles also gets ``monai`` (an alarm inside ``import monai`` left the worker
unable to build any bundle network, and ``seg.cardiac`` fell back to its classical method for
the rest of the cardiac ablation)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from bcer.contracts.spec import ToolSpec
from bcer.engine.noderun import frameworks_for
from bcer.tools.registry import get_tool


def _wanted(name: str) -> list[str]:
    reg = get_tool(name)
    return frameworks_for(reg.spec, reg.params_model.model_fields)


def test_each_tool_gets_the_frameworks_its_code_imports() -> None:
    assert get_tool("quant.roi_stats").spec.gpu == "none" and _wanted("quant.roi_stats") == []
    assert get_tool("recon.sense").spec.gpu == "optional"
    for recon in ("recon.sense", "recon.grappa", "recon.zero_filled", "recon.sense_cine"):
        assert _wanted(recon) == ["cupy"], recon  # their GPU path is cupy: never torch
    assert _wanted("denoise.nlm") == ["torch"]  # undeclared, GPU path: torch
    for seg in ("seg.cardiac", "seg.prostate", "seg.brain_tumor"):
        assert _wanted(seg) == ["torch", "monai"], seg  # runs MONAI bundles
    assert frameworks_for(ToolSpec(name="x.y", gpu="optional", frameworks=[])) == []
    assert frameworks_for(ToolSpec(name="x.y", frameworks=["monai"]), ["bundle_dir"]) == ["monai"]


def test_framework_imported_outside_the_limit_only_for_gpu_tools() -> None:
    """In a fresh process: the imports really happen (torch is ~2 s; monai, measured at ~9 s on
    an idle core, is left to the test above), and never for a CPU tool or an unknown one."""
    code = textwrap.dedent("""
        import sys
        from bcer.engine.noderun import _framework_imports
        _framework_imports("quant.roi_stats")
        _framework_imports("recon.sense")  # cupy (not installed here): nothing
        _framework_imports("no.such_tool")  # unknown: left to call_tool's typed error
        before = "torch" in sys.modules
        _framework_imports("denoise.nlm")
        print(before, "torch" in sys.modules, "monai" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "False"]
