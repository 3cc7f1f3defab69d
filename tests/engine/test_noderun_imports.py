"""A GPU-capable tool's framework is imported before its time limit is armed (an alarm inside
``import torch`` would poison the worker for every later torch tool); CPU-only tools never
import it. A tool that runs MONAI bundles also gets ``monai`` (an alarm inside ``import monai``
left the worker unable to build any bundle network, and ``seg.cardiac`` fell back to its
classical method for the rest of the cardiac ablation)."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_framework_imported_outside_the_limit_only_for_gpu_tools() -> None:
    code = textwrap.dedent("""
        import sys
        from bcer.engine.noderun import _framework_imports
        from bcer.tools.registry import get_tool
        assert get_tool("quant.roi_stats").spec.gpu == "none" and get_tool("seg.cardiac").spec.gpu == "optional"
        assert get_tool("recon.sense").spec.gpu == "optional"
        _framework_imports("quant.roi_stats")
        before = "torch" in sys.modules
        _framework_imports("recon.sense")  # GPU-capable, no bundle: torch only
        torch_only = "torch" in sys.modules and "monai" not in sys.modules
        _framework_imports("seg.cardiac")  # runs MONAI bundles: monai too
        _framework_imports("no.such_tool")  # unknown: left to call_tool's typed error
        print(before, torch_only, "monai.networks.nets.unet" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "True"]
