"""Structured reports (``report.structured``): JSON + Markdown where every number is traceable.

Each number in the Markdown text is written by one function (:class:`_Writer.num`) that also
records it in ``Report.evidence`` as ``{value, raw, unit, node, field, key, id}``: the node and
output field it came from (``meta["origin"]`` set by the executor, else the port name) and
the key inside that artifact. The number is followed by its id in a code span
(`` `[node.field.key]` ``). Everything else that may contain digits (ROI names, lesion ids, rule
names, labels) is written in code spans too, so an auditor can strip code spans and match
every remaining number, in order, to ``Report.evidence``.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..contracts.artifacts import Classification, Findings, Report, Table
from ..contracts.errors import ErrorCode, ToolError
from .classify import origin_of
from .registry import tool

log = logging.getLogger(__name__)

Domain = Literal["auto", "brain", "cardiac", "prostate", "general"]
_TITLES = {"brain": "Brain tumour MRI report", "cardiac": "Cardiac MRI report",
           "prostate": "Prostate MRI report", "general": "MRI report"}
_NAMES = {
    "lv_edv_ml": "LV end-diastolic volume", "lv_esv_ml": "LV end-systolic volume", "lv_sv_ml": "LV stroke volume",
    "lv_ef_pct": "LV ejection fraction", "rv_edv_ml": "RV end-diastolic volume", "rv_esv_ml": "RV end-systolic volume",
    "rv_sv_ml": "RV stroke volume", "rv_ef_pct": "RV ejection fraction", "myo_mass_g": "LV myocardial mass",
    "myo_volume_ml": "myocardial volume", "max_wall_thickness_mm": "maximal LV wall thickness",
    "bsa_m2": "body surface area", "lv_edvi_ml_m2": "LV end-diastolic volume index",
    "lv_esvi_ml_m2": "LV end-systolic volume index", "rv_edvi_ml_m2": "RV end-diastolic volume index",
    "rv_esvi_ml_m2": "RV end-systolic volume index", "lv_mass_index_g_m2": "LV mass index",
    "n_abnormal_segments": "abnormally contracting segments", "n_segments": "segments analysed",
    "median_segment_thickening_pct": "median segmental wall thickening",
    "min_segment_thickening_pct": "lowest segmental wall thickening", "ed_frame": "end-diastolic frame",
    "es_frame": "end-systolic frame", "n_frames": "frames", "height_cm": "height", "weight_kg": "weight",
    "volume_ml": "volume", "max_diameter_mm": "largest diameter", "mean": "mean intensity",
    "median": "median intensity", "std": "intensity SD", "centroid_x": "centroid x (RAS)",
    "centroid_y": "centroid y (RAS)", "centroid_z": "centroid z (RAS)", "size_mm": "largest diameter",
    "adc": "ADC", "t2_ratio": "T2w ratio to normal zone", "voxels": "voxels",
}
_UNITS = {"mL/m2": "mL/m²", "g/m2": "g/m²", "m2": "m²", "1e-6 mm2/s": "µm²/s", "mm2/s": "mm²/s"}
_SUPER = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


class ReportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field("", max_length=200, description="report title; empty: from the domain")
    domain: Domain = Field("auto", description="organ/domain of the report; auto: from the inputs")
    decimals: int = Field(1, ge=0, le=4, description="decimals of non-integer numbers in the text")


def _unit(u: str) -> str:
    """Units as text without ASCII digits (so every ASCII digit in the report is a number)."""
    return _UNITS.get(u, u.translate(_SUPER))


def _label(key: str) -> str:
    name = _NAMES.get(key, key.replace("_", " "))
    return f"`{name}`" if any(c.isdigit() for c in name) else name


class _Writer:
    def __init__(self, decimals: int):
        self.decimals = decimals
        self.lines: list[str] = []
        self.evidence: list[dict[str, Any]] = []

    def num(self, value: Any, unit: str, origin: dict[str, str], key: str) -> str:
        raw = float(value)
        if isinstance(value, int):
            text = str(value)
        else:
            # ratios below 1 (T2w ratio 0.46) and BSA (1.93 m2) need two decimals to stay meaningful
            d = max(self.decimals, 2) if abs(raw) < 1 or unit == "m2" else self.decimals
            text = f"{round(raw, d) + 0.0:.{d}f}"  # + 0.0: no "-0.0" in the text
            if float(text) == 0:
                text = f"{0.0:.{d}f}"
        ev_id = f"{origin['node']}.{origin['field']}.{key}"
        self.evidence.append({"value": float(text), "raw": raw, "unit": unit, "node": origin["node"],
                              "field": origin["field"], "key": key, "id": ev_id})
        u = f" {_unit(unit)}" if unit and unit not in ("frame", "frames") else ""
        return f"{text}{u} `[{ev_id}]`"


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _table_items(w: _Writer, table: Table, port: str) -> list[dict[str, Any]]:
    origin = origin_of(table, port)
    out = []
    for i, row in enumerate(table.rows):
        name = str(row.get("roi", f"row {i}"))
        if len(table.rows) > 1:
            w.lines.append(f"### `{name}`")
        items = {}
        for col, v in row.items():
            key = col if len(table.rows) == 1 else f"rows[{i}].{col}"
            if _numeric(v):
                w.lines.append(f"- {_label(col)}: {w.num(v, table.units.get(col, ''), origin, key)}")
                items[col] = {"value": v, "unit": table.units.get(col, ""), "evidence": w.evidence[-1]["id"]}
            elif isinstance(v, str) and col not in ("roi",):
                w.lines.append(f"- {_label(col)}: `{v}`")
                items[col] = {"value": v}
        out.append({"name": name, "items": items})
    return out


def _findings_items(w: _Writer, findings: Findings, domain: str) -> list[dict[str, Any]]:
    origin = origin_of(findings, "findings")
    out = []
    if not findings.items:
        w.lines.append("- no lesion detected" if domain == "prostate" else "- no finding")
    for f in findings.items:
        side = {"R": "right", "L": "left"}.get(f.side, f.side)
        parts = [f"`{f.zone or 'unknown zone'}`", side,
                 f"volume {w.num(f.volume_ml, 'mL', origin, f'{f.id}.volume_ml')}"]
        for attr, unit in (("size_mm", "mm"), ("adc", "1e-6 mm2/s"), ("t2_ratio", "")):
            if _numeric(f.attributes.get(attr)):
                parts.append(f"{_label(attr)} {w.num(f.attributes[attr], unit, origin, f'{f.id}.{attr}')}")
        w.lines.append(f"- `{f.id}` ({f.label}): " + ", ".join(parts))
        out.append({"id": f.id, "label": f.label, "zone": f.zone, "side": f.side, "volume_ml": f.volume_ml,
                    "box_voxel": [list(b) for b in f.box_voxel], "box_world": [list(b) for b in f.box_world],
                    "attributes": {k: v for k, v in f.attributes.items() if _numeric(v) or isinstance(v, str)}})
    return out


def _impression(w: _Writer, c: Classification) -> dict[str, Any]:
    origin = origin_of(c, "classification")
    w.lines.append(f"- conclusion: `{c.label}`")
    if c.meta.get("decision"):
        w.lines.append(f"- reason: {c.meta['decision']}")
    for lesion_id, score in c.scores.items():
        if _numeric(score) and lesion_id.startswith("lesion"):
            w.lines.append(f"- `{lesion_id}` category: {w.num(int(score), '', origin, f'scores.{lesion_id}')}")
    for i, r in enumerate(c.rule_trace):
        parts = [f"`{r.get('rule', '')}`"]
        for part in ("value", "threshold"):
            v = r.get(part)
            parts.append(f"{part} {w.num(v, '', origin, f'rule_trace[{i}].{part}')}" if _numeric(v)
                         else f"{part} `{v}`")
        parts.append("met" if r.get("passed") else "not met")
        w.lines.append("- rule " + ", ".join(parts))
    return {"label": c.label, "rule_trace": list(c.rule_trace), "evidence": dict(c.evidence),
            "decision": c.meta.get("decision", "")}


def _domain(p: ReportParams, tables: list[Table], c: Classification | None, findings: Findings | None) -> str:
    if p.domain != "auto":
        return p.domain
    if c is not None:
        if c.label in ("NOR", "DCM", "HCM", "MINF", "RV"):
            return "cardiac"
        if c.label in ("HGG", "LGG"):
            return "brain"
        if c.label.startswith("PI-RADS"):
            return "prostate"
    if any(t.name in ("cardiac_function", "phases") for t in tables):
        return "cardiac"
    return "prostate" if findings is not None else "general"


_SECTION = {"cardiac": ("Cardiac function", "Myocardial and chamber features"),
            "brain": ("Tumour measurements", "Tumour compartments"),
            "prostate": ("Gland measurements", "Zone and region features")}


@tool("report.structured", version="1.0", milestone="report", resources={"num_cpus": 1, "memory_mb": 256},
      output="report")
def structured(params: ReportParams, measurements: Table | None = None, features: Table | None = None,
               classification: Classification | None = None, findings: Findings | None = None) -> Report:
    """A structured report: Markdown ``text`` and a JSON ``structured`` dict, sections per
    domain (measurements, features, findings, impression), every number with its evidence.

    Returns:
        Report whose ``evidence`` lists ``{value, raw, unit, node, field, key, id}`` for each
        number in the text, in order of appearance.

    Raises:
        ToolError: ``input_missing`` when no input is given.
    """
    tables = [t for t in (measurements, features) if t is not None]
    if not tables and classification is None and findings is None:
        raise ToolError(ErrorCode.input_missing, "report.structured needs at least one of measurements, "
                        "features, classification, findings", arg="measurements")
    domain = _domain(params, tables, classification, findings)
    title = params.title or _TITLES[domain]
    w = _Writer(params.decimals)
    w.lines.append(f"# {title}")
    names = _SECTION.get(domain, ("Measurements", "Features"))
    sections: list[dict[str, Any]] = []
    for heading, table, port in ((names[0], measurements, "measurements"), (names[1], features, "features")):
        if table is not None:
            w.lines += ["", f"## {heading}"]
            sections.append({"title": heading, "source": origin_of(table, port), "rows": _table_items(w, table, port)})
    if findings is not None:
        w.lines += ["", "## Findings"]
        sections.append({"title": "Findings", "source": origin_of(findings, "findings"),
                         "findings": _findings_items(w, findings, domain)})
    impression = None
    if classification is not None:
        w.lines += ["", "## Impression"]
        impression = _impression(w, classification)
    structured_out = {"title": title, "domain": domain, "sections": sections, "impression": impression}
    return Report("\n".join(w.lines) + "\n", structured_out, w.evidence,
                  meta={"method": "template per domain; numbers only through the evidence writer",
                        "n_numbers": len(w.evidence)})
