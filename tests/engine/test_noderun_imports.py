"""A GPU-capable tool's frameworks are imported before its time limit is armed (an alarm inside
``import torch`` would poison the worker for every later torch tool); CPU-only tools never
import them, and a run gets only what its path imports (the recon tools' GPU path is cupy and
their CPU path numpy; denoise.nlm imports torch on a GPU only). A tool
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


def _wanted(name: str, device: str = "cpu") -> list[str]:
    reg = get_tool(name)
    return frameworks_for(reg.spec, reg.params_model.model_fields, device)


def test_each_run_gets_the_frameworks_its_path_imports() -> None:
    assert get_tool("quant.roi_stats").spec.gpu == "none" and _wanted("quant.roi_stats", "cuda") == []
    assert get_tool("recon.sense").spec.gpu == "optional"
    for recon in ("recon.sense", "recon.grappa", "recon.zero_filled", "recon.sense_cine"):
        # the GPU path is cupy, the CPU path numpy: never torch, cupy only on a GPU
        assert _wanted(recon) == [] and _wanted(recon, "cuda") == ["cupy"], recon
    assert _wanted("denoise.nlm") == [] and _wanted("denoise.nlm", "cuda") == ["torch"]  # CPU: scikit-image
    for seg in ("seg.cardiac", "seg.prostate", "seg.brain_tumor"):
        # the bundle network runs in torch on either device, built by MONAI
        assert _wanted(seg) == _wanted(seg, "cuda") == ["torch", "monai"], seg
    assert frameworks_for(ToolSpec(name="x.y", gpu="optional", frameworks=[]), device="cuda") == []
    assert frameworks_for(ToolSpec(name="x.y", gpu="optional")) == ["torch"]  # undeclared: torch
    assert frameworks_for(ToolSpec(name="x.y", frameworks=["monai"]), ["bundle_dir"]) == ["monai"]


def test_framework_imported_outside_the_limit_only_for_gpu_tools() -> None:
    """In a fresh process: the imports really happen (torch is ~2 s; monai, measured at ~9 s on
    an idle core, is left to the test above), and never for a CPU tool or an unknown one."""
    code = textwrap.dedent("""
        import sys
        from bcer.engine.noderun import _framework_imports
        _framework_imports("quant.roi_stats", "cuda")
        _framework_imports("recon.sense", "cuda")  # cupy (not installed here): nothing
        _framework_imports("denoise.nlm", "cpu")  # scikit-image on the CPU: no torch
        _framework_imports("no.such_tool")  # unknown: left to call_tool's typed error
        before = "torch" in sys.modules
        _framework_imports("denoise.nlm", "cuda")
        print(before, "torch" in sys.modules, "monai" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "False"]


def test_a_stale_copy_of_a_user_module_is_named(tmp_path, monkeypatch, caplog) -> None:
    """A worker that imported ``stale_tools`` from one folder keeps it when the driver later
    registers a different file of that name: the worker warns, naming both files. A copy
    with the same content elsewhere (a runtime_env unpacking) is silent."""
    import logging

    from bcer.engine.noderun import import_tool_module

    old, new, same = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder, text in ((old, "VALUE = 1\n"), (new, "VALUE = 2\n"), (same, "VALUE = 1\n")):
        folder.mkdir()
        (folder / "stale_tools.py").write_text(text)
    monkeypatch.syspath_prepend(str(old))
    monkeypatch.delitem(sys.modules, "stale_tools", raising=False)
    with caplog.at_level(logging.WARNING, logger="bcer.engine.noderun"):
        import_tool_module("stale_tools", str(same / "stale_tools.py"))
        assert not caplog.records
        import_tool_module("stale_tools", str(new / "stale_tools.py"))
    assert sys.modules["stale_tools"].VALUE == 1  # the first copy stays
    (msg,) = [r.getMessage() for r in caplog.records]
    assert str(old / "stale_tools.py") in msg and str(new / "stale_tools.py") in msg
    monkeypatch.delitem(sys.modules, "stale_tools")
