"""The inputs of a report node, computed in-process on a bench phantom of a report task.

The same generators as ``bcer bench`` (``bench.cases.TASK_DATA``) and the same tool chain as
the offline planner's workflow (node ids as it names them), called directly through the
registry with each output stamped with its origin as the executor does: cheap enough to
build a corpus of hundreds of reports without Ray, and the evidence ids look like a run's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..contracts import ErrorCode, ToolError
from ..contracts.artifacts import Transform
from .cases import TASK_DATA, case_seeds

REPORT_TASKS = ("brain_report", "prostate_report", "cardiac_report")


def _run(node: str, tool: str, inputs: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
    from ..tools.registry import call_tool

    out = call_tool(tool, inputs, params)
    for field, art in out.items():
        if isinstance(getattr(art, "meta", None), dict):
            art.meta["origin"] = {"node": node, "field": field, "tool": tool}
    return out


def report_inputs(task: str, i: int, seed: int = 0, size: str = "small") -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs of ``report.structured``, case info: id, metadata, truth) for case ``i`` of ``task``.

    Raises:
        ToolError: ``value_range`` for a task that writes no report.
    """
    if task not in REPORT_TASKS:
        raise ToolError(ErrorCode.value_range, f"{task!r} is not a report task", hint=f"one of {REPORT_TASKS}")
    spec = TASK_DATA[task]
    cid = f"{spec.prefix}{i:03d}"
    ph = spec.make(cid, case_seeds(task, i + 1, seed)[i], size, i)
    info = {"case": cid, "metadata": dict(ph.metadata), "truth": dict(ph.truth)}
    if task == "brain_report":
        feats = _run("quant_roi_features", "quant.roi_features",
                     {"image": ph.sequences["T1"], "mask": ph.labels["seg"]})["features"]
        cls = _run("classify_glioma_grade", "classify.glioma_grade", {"features": feats})["classification"]
        return {"measurements": feats, "features": feats, "classification": cls}, info
    if task == "cardiac_report":
        phases = _run("cardiac_ed_es", "cardiac.ed_es", {"labels": ph.labels["seg"]})["phases"]
        fn = _run("quant_cardiac_function", "quant.cardiac_function", {"labels": ph.labels["seg"], "phases": phases},
                  {"height_cm": ph.metadata["height"], "weight_kg": ph.metadata["weight"]})["function"]
        cls = _run("classify_cardiac_acdc", "classify.cardiac_acdc", {"function": fn})["classification"]
        return {"measurements": fn, "features": phases, "classification": cls}, info
    det = _run("detect_prostate_lesions", "detect.prostate_lesions", {
        "adc": ph.sequences["ADC"], "dwi": ph.sequences["DWI"], "gland": ph.labels["gland"],
        "zones": ph.labels["zones"], "t2w": ph.sequences["T2w"],
        "transform": Transform(np.array(ph.truth["misalignment"]["matrix"]))})["findings"]
    feats = _run("quant_roi_features", "quant.roi_features",
                 {"image": ph.sequences["T2w"], "mask": ph.labels["gland"]})["features"]
    cls = _run("classify_pirads", "classify.pirads", {"findings": det})["classification"]
    return {"measurements": feats, "features": feats, "classification": cls, "findings": det}, info


__all__ = ["REPORT_TASKS", "report_inputs"]
