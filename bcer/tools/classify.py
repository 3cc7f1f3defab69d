"""Rule-based classifiers with their rule trace: ACDC cardiac groups, glioma grade, PI-RADS.

Every decision is a short chain of documented rules over measurements produced upstream;
``Classification.rule_trace`` lists each rule as ``{rule, value, threshold, passed}`` (in the
order evaluated) and ``Classification.evidence`` maps each measurement used to its id
``<node>.<field>.<key>`` (the upstream node output it came from, see :func:`origin_of`).
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..contracts.artifacts import Classification, Findings, Mask, Table
from ..contracts.errors import ErrorCode, ToolError
from ._checks import require_ndim
from .registry import tool

log = logging.getLogger(__name__)


def origin_of(artifact: Any, port: str) -> dict[str, str]:
    """Where an input artifact came from: ``meta["origin"]`` set by the executor on node
    outputs (``{"node", "field", "tool"}``), else the port name (direct calls, unit tests)."""
    o = dict(getattr(artifact, "meta", {}).get("origin") or {})
    return {"node": str(o.get("node", port)), "field": str(o.get("field", port)), "tool": str(o.get("tool", ""))}


def evidence_id(artifact: Any, port: str, key: str) -> str:
    o = origin_of(artifact, port)
    return f"{o['node']}.{o['field']}.{key}"


def _rule(trace: list[dict[str, Any]], rule: str, value: Any, threshold: Any, passed: bool) -> bool:
    trace.append({"rule": rule, "value": value, "threshold": threshold, "passed": bool(passed)})
    return bool(passed)


# --- ACDC ------------------------------------------------------------------------------------


class AcdcParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lvef_low_pct: float = Field(40.0, ge=0.0, le=100.0, description="LVEF below this is reduced (DCM/MINF)")
    lvef_hcm_pct: float = Field(55.0, ge=0.0, le=100.0, description="HCM needs LVEF above this (preserved/hyperdynamic)")
    lvedvi_high: float = Field(100.0, ge=0.0, le=500.0, description="LVEDV index above this (mL/m2) is dilated")
    rvedvi_high: float = Field(110.0, ge=0.0, le=500.0, description="RVEDV index above this (mL/m2) is dilated")
    rvef_low_pct: float = Field(40.0, ge=0.0, le=100.0, description="RVEF below this is reduced")
    wall_hcm_mm: float = Field(15.0, ge=0.0, le=60.0, description="max ED wall thickness at or above this is hypertrophy")
    mass_index_hcm: float = Field(110.0, ge=0.0, le=500.0, description="LV mass index at or above this (g/m2) is hypertrophy")
    min_abnormal_segments: int = Field(2, ge=1, le=100,
                                       description="regional contraction abnormality: at least this many abnormal segments")


_WALL_KEYS = ("robust_segment_wall_mm", "max_segment_wall_mm", "max_wall_thickness_mm")
_ACDC_KEYS = ("lv_ef_pct", "lv_edvi_ml_m2", "rv_edvi_ml_m2", "rv_ef_pct", "wall_mm",
              "lv_mass_index_g_m2", "n_abnormal_segments")


def _function_values(function: Table) -> tuple[dict[str, float], str]:
    """The measurements the ACDC rules use. Wall thickness is, in this order of preference, the
    thickest sector wall that two slices reach (robust to a one-slice excursion of a coarse
    segmentation), the thickest segment (ACDC's "segment thickness", robust to stray
    segmentation voxels), else the largest voxel distance to the cavity."""
    if not function.rows:
        raise ToolError(ErrorCode.value_range, "function table has no rows", arg="function")
    row = dict(function.rows[0])
    wall_key = next((k for k in _WALL_KEYS if _finite(row.get(k))), _WALL_KEYS[-1])
    row["wall_mm"] = row.get(wall_key)
    missing = [wall_key if k == "wall_mm" else k for k in _ACDC_KEYS if row.get(k) is None]
    if missing:
        raise ToolError(ErrorCode.input_missing, f"function table lacks {missing}",
                        hint="use quant.cardiac_function with height_cm/weight_kg bound to @case.height/@case.weight",
                        arg="function")
    vals = {k: float(row[k]) for k in _ACDC_KEYS}
    bad = [k for k, v in vals.items() if not np.isfinite(v)]
    if bad:
        raise ToolError(ErrorCode.numeric, f"function table has non-finite {bad}", arg="function")
    return vals, wall_key


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))


@tool("classify.cardiac_acdc", version="1.1", milestone="classification", resources={"num_cpus": 1, "memory_mb": 256},
      output="classification")
def cardiac_acdc(function: Table, params: AcdcParams) -> Classification:
    """ACDC group (NOR, DCM, HCM, MINF, RV) from cardiac function by the ACDC criteria.

    Order: HCM if LVEF > 55 % and (thickest segment >= 15 mm or LV mass index >= 110 g/m2); else with
    LVEF < 40 %: MINF when >= 2 segments contract abnormally (akinetic and thinned), DCM when
    LVEDVi > 100 mL/m2, else MINF (reduced EF without dilation); else RV if RVEDVi > 110 mL/m2
    or RVEF < 40 %; else NOR.

    Args:
        function: the ``quant.cardiac_function`` table (indexed values need height/weight).

    Returns:
        Classification with the group, every rule evaluated, and evidence ids.

    Raises:
        ToolError: ``input_missing`` (a needed measurement absent), ``numeric`` (NaN).
    """
    v, wall_key = _function_values(function)
    p, tr = params, []
    reduced = _rule(tr, "LVEF < lvef_low", v["lv_ef_pct"], p.lvef_low_pct, v["lv_ef_pct"] < p.lvef_low_pct)
    preserved = _rule(tr, "LVEF > lvef_hcm", v["lv_ef_pct"], p.lvef_hcm_pct, v["lv_ef_pct"] > p.lvef_hcm_pct)
    thick = _rule(tr, "max wall >= wall_hcm", v["wall_mm"], p.wall_hcm_mm, v["wall_mm"] >= p.wall_hcm_mm)
    heavy = _rule(tr, "LV mass index >= mass_index_hcm", v["lv_mass_index_g_m2"], p.mass_index_hcm,
                  v["lv_mass_index_g_m2"] >= p.mass_index_hcm)
    dilated = _rule(tr, "LVEDVi > lvedvi_high", v["lv_edvi_ml_m2"], p.lvedvi_high, v["lv_edvi_ml_m2"] > p.lvedvi_high)
    regional = _rule(tr, "abnormal segments >= min_abnormal_segments", v["n_abnormal_segments"],
                     p.min_abnormal_segments, v["n_abnormal_segments"] >= p.min_abnormal_segments)
    rv_big = _rule(tr, "RVEDVi > rvedvi_high", v["rv_edvi_ml_m2"], p.rvedvi_high, v["rv_edvi_ml_m2"] > p.rvedvi_high)
    rv_poor = _rule(tr, "RVEF < rvef_low", v["rv_ef_pct"], p.rvef_low_pct, v["rv_ef_pct"] < p.rvef_low_pct)
    if preserved and (thick or heavy):
        label, why = "HCM", "preserved LVEF with hypertrophy"
    elif reduced and regional:
        label, why = "MINF", "reduced LVEF with regional contraction abnormality"
    elif reduced and dilated:
        label, why = "DCM", "reduced LVEF with a dilated LV"
    elif reduced:
        label, why = "MINF", "reduced LVEF without LV dilation"
    elif rv_big or rv_poor:
        label, why = "RV", "dilated or poorly contracting RV"
    else:
        label, why = "NOR", "no criterion met"
    used = [wall_key if k == "wall_mm" else k for k in _ACDC_KEYS]
    evidence = {k: evidence_id(function, "function", k) for k in used}
    return Classification(label, tr, evidence, meta={"decision": why, "method": "ACDC criteria, ordered rules"})


# --- glioma grade ----------------------------------------------------------------------------


class GliomaParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enhancing_label: int = Field(4, ge=1, le=255, description="label value of enhancing tumour (BraTS: 4)")
    min_enhancing_ml: float = Field(0.5, ge=0.0, le=100.0, description="HGG needs at least this enhancing volume (mL)")
    min_enhancing_fraction: float = Field(0.02, ge=0.0, le=1.0,
                                          description="and at least this fraction of the whole tumour")


def _volumes_from_table(features: Table, et_label: int) -> tuple[float, float, str, str]:
    """(enhancing mL, whole tumour mL, key of ET, key of WT) from a roi_features/roi_stats table."""
    def labels_of(row: dict[str, Any]) -> list[int]:
        labs = row.get("labels", [row.get("label")])
        return [int(x) for x in labs if x is not None]

    single = [(i, r) for i, r in enumerate(features.rows) if len(labels_of(r)) == 1 and "volume_ml" in r]
    if not single:
        raise ToolError(ErrorCode.schema, "features table has no per-label rows with volume_ml", arg="features")
    et = [(i, r) for i, r in single if labels_of(r) == [et_label]]
    et_ml = float(et[0][1]["volume_ml"]) if et else 0.0
    wt_ml = float(sum(r["volume_ml"] for _, r in single))
    et_key = f"rows[{et[0][0]}].volume_ml" if et else f"label_{et_label}.volume_ml(absent=0)"
    return et_ml, wt_ml, et_key, "sum(rows[*].volume_ml)"


@tool("classify.glioma_grade", version="1.0", milestone="classification", resources={"num_cpus": 1, "memory_mb": 256},
      output="classification")
def glioma_grade(params: GliomaParams, features: Table | None = None, labels: Mask | None = None) -> Classification:
    """HGG/LGG from the presence and volume of enhancing tumour.

    HGG when the enhancing volume is at least ``min_enhancing_ml`` and at least
    ``min_enhancing_fraction`` of the whole tumour (all labelled voxels); else LGG.

    Args:
        features: per-label ``quant.roi_features`` (or ``roi_stats``) table of the tumour labels.
        labels: the BraTS label mask, used when no table is given.

    Raises:
        ToolError: ``input_missing`` (neither input), ``schema`` (table without volumes),
            ``value_range`` (empty tumour).
    """
    if features is not None:
        et_ml, wt_ml, et_key, wt_key = _volumes_from_table(features, params.enhancing_label)
        src, port = features, "features"
    elif labels is not None:
        require_ndim(labels, 3, "labels")
        data = np.asarray(labels.data)
        et_ml = float(np.count_nonzero(data == params.enhancing_label) * labels.voxel_volume_ml)
        wt_ml = float(np.count_nonzero(data) * labels.voxel_volume_ml)
        et_key, wt_key, src, port = f"label_{params.enhancing_label}.volume_ml", "nonzero.volume_ml", labels, "labels"
    else:
        raise ToolError(ErrorCode.input_missing, "classify.glioma_grade needs 'features' or 'labels'", arg="features")
    if wt_ml <= 0:
        raise ToolError(ErrorCode.value_range, "no tumour voxels: cannot grade", arg=port)
    tr: list[dict[str, Any]] = []
    big = _rule(tr, "enhancing volume >= min_enhancing_ml", et_ml, params.min_enhancing_ml, et_ml >= params.min_enhancing_ml)
    frac = et_ml / wt_ml
    share = _rule(tr, "enhancing fraction >= min_enhancing_fraction", frac, params.min_enhancing_fraction,
                  frac >= params.min_enhancing_fraction)
    label = "HGG" if big and share else "LGG"
    evidence = {"enhancing_ml": evidence_id(src, port, et_key), "whole_tumour_ml": evidence_id(src, port, wt_key)}
    return Classification(label, tr, evidence, scores={"enhancing_ml": et_ml, "whole_tumour_ml": wt_ml,
                                                       "enhancing_fraction": frac},
                          meta={"method": "enhancing-tumour presence and share"})


# --- PI-RADS ----------------------------------------------------------------------------------


class PiradsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adc_marked: float = Field(850.0, ge=0.0, le=5000.0, description="ADC below this (1e-6 mm2/s) is markedly restricted")
    t2_marked: float = Field(0.6, ge=0.0, le=2.0, description="lesion/zone T2w ratio below this is markedly hypointense")
    size_large_mm: float = Field(15.0, ge=0.0, le=100.0, description="largest diameter at or above this is large")


def _lesion_category(f: Any, p: PiradsParams, tr: list[dict[str, Any]]) -> int:
    """Simplified PI-RADS v2.1 (the rule of ``bcer.datasets.prostate``): PZ by DWI/ADC,
    TZ by T2w with the DWI upgrade."""
    a = f.attributes
    for key in ("adc", "size_mm"):
        if a.get(key) is None:
            raise ToolError(ErrorCode.input_missing, f"finding {f.id!r} has no {key!r}", arg="findings")
    large = _rule(tr, f"{f.id}: size >= size_large_mm", a["size_mm"], p.size_large_mm, a["size_mm"] >= p.size_large_mm)
    marked = _rule(tr, f"{f.id}: ADC < adc_marked", a["adc"], p.adc_marked, a["adc"] < p.adc_marked)
    if f.zone == "PZ":
        return (5 if large else 4) if marked else 3
    if f.zone != "TZ":
        raise ToolError(ErrorCode.value_range, f"finding {f.id!r} has zone {f.zone!r}; PI-RADS needs PZ or TZ",
                        hint="give detect.prostate_lesions the zones mask", arg="findings")
    if a.get("t2_ratio") is None:
        raise ToolError(ErrorCode.input_missing, f"TZ finding {f.id!r} has no t2_ratio (TZ is scored on T2w)",
                        hint="give detect.prostate_lesions the t2w image", arg="findings")
    dark = _rule(tr, f"{f.id}: T2 ratio < t2_marked", a["t2_ratio"], p.t2_marked, a["t2_ratio"] < p.t2_marked)
    if dark:
        return 5 if large else 4
    return 4 if (marked and large) else 3


@tool("classify.pirads", version="1.0", milestone="classification", resources={"num_cpus": 1, "memory_mb": 256},
      output="classification")
def pirads(findings: Findings, params: PiradsParams) -> Classification:
    """Simplified PI-RADS v2.1 category per lesion; the case label is the highest category.

    PZ: ADC < 850 -> (size >= 15 mm ? 5 : 4), else 3. TZ: T2 ratio < 0.6 -> (size >= 15 mm ?
    5 : 4), else 3, upgraded to 4 if ADC < 850 and size >= 15 mm. No lesion: "PI-RADS 1".

    Returns:
        Classification ``label`` "PI-RADS <n>", ``scores`` {lesion id: category}, per-lesion
        rule trace, evidence ids of each lesion's zone/size/ADC/T2 ratio.

    Raises:
        ToolError: ``input_missing`` (a lesion without ADC/size, a TZ lesion without T2 ratio),
            ``value_range`` (a lesion without a zone).
    """
    tr: list[dict[str, Any]] = []
    scores: dict[str, float] = {}
    evidence: dict[str, str] = {}
    for f in findings.items:
        scores[f.id] = float(_lesion_category(f, params, tr))
        for key in ("zone", "size_mm", "adc", "t2_ratio"):
            if key == "zone" or f.attributes.get(key) is not None:
                evidence[f"{f.id}.{key}"] = evidence_id(findings, "findings", f"{f.id}.{key}")
    top = int(max(scores.values(), default=1))
    lesions = [{"id": f.id, "category": int(scores[f.id]), "zone": f.zone, "side": f.side} for f in findings.items]
    return Classification(f"PI-RADS {top}", tr, evidence, scores,
                          meta={"method": "simplified PI-RADS v2.1", "max_category": top, "lesions": lesions})
