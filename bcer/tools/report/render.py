"""A draft and its evidence as the report deliverable: Markdown text, structured JSON, and the
evidence list (one entry per number in the text, in order, resolved to its node and field).

Text layout: title, About this report (case, series, methods, flags, version, date and the
research-use line: :mod:`.header`), Findings (prose), Impression (bulleted), then the
appendices a researcher audits: Measurements (each input table once), Lesion boxes, Decision
rules, and Evidence last. Drafts write every number followed by its evidence link
``[node.field.key]`` in a code span; the Markdown text turns each link into a footnote marker
``[^n]`` defined in the Evidence section (``Report.evidence`` and the structured sentences keep
the links). Everything else that holds digits (ROI names, lesion ids, labels, boxes, the
header's values) is in code spans, so an auditor can drop the metadata sections
(:func:`.header.strip_metadata`), footnote markers and code spans, and match every remaining
number, in order, to ``Report.evidence``.
"""
from __future__ import annotations

import math
from typing import Any

from .evidence import Evidence
from .header import METADATA_KEYS, evidence_lines, footnoted, header_lines, header_of
from .lexicon import CODE, LINK, LINKED_NUMBER
from .prose import Draft, num, unit_text

TITLES = {"brain": "Brain tumour MRI report", "cardiac": "Cardiac MRI report",
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
    "max_segment_wall_mm": "thickest segment wall", "robust_segment_wall_mm": "thickest wall two slices reach",
    "ed_es_confidence": "ED/ES phase confidence", "ed_alternative": "alternative end-diastolic frame",
    "es_alternative": "alternative end-systolic frame",
    "lv_ef_min_pct": "LV ejection fraction, least with the alternative frames",
    "lv_ef_max_pct": "LV ejection fraction, largest with the alternative frames",
    "rv_ef_min_pct": "RV ejection fraction, least with the alternative frames",
    "rv_ef_max_pct": "RV ejection fraction, largest with the alternative frames",
    "ed_runner_up": "runner-up end-diastolic frame", "es_runner_up": "runner-up end-systolic frame",
    "ed_margin_sd": "end-diastolic margin (noise SD)", "es_margin_sd": "end-systolic margin (noise SD)",
    "phase_noise_sd_ml": "blood curve noise SD", "ed_noise_sd_ml": "end-diastolic border curve noise SD",
    "lv_volume_ed_ml": "LV volume at ED",
    "lv_volume_es_ml": "LV volume at ES",
    "volume_ml": "volume", "max_diameter_mm": "largest diameter", "mean": "mean intensity",
    "median": "median intensity", "std": "intensity SD", "centroid_x": "centroid x (RAS)",
    "centroid_y": "centroid y (RAS)", "centroid_z": "centroid z (RAS)",
}
_APPENDIX = {"brain": "Tumour compartments", "cardiac": "Function and phases", "prostate": "Gland"}


def _label(key: str) -> str:
    name = _NAMES.get(key, key.replace("_", " "))
    return f"`{name}`" if any(c.isdigit() for c in name) else name


def _numeric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _table_lines(ev: Evidence, decimals: int) -> tuple[list[str], list[dict[str, Any]]]:
    lines, sections = [], []
    for port, table, origin in ev.tables:
        rows = []
        for i, row in enumerate(table.rows):
            name = str(row.get("roi", f"row {i}"))
            if len(table.rows) > 1:
                lines.append(f"### `{name}`")
            items = {}
            for col, v in row.items():
                key = col if len(table.rows) == 1 else f"rows[{i}].{col}"
                fact = ev.facts.get(f"{origin['node']}.{origin['field']}.{key}")
                if _numeric(v) and fact is not None:
                    lines.append(f"- {_label(col)}: {num(fact, decimals)}")
                    items[col] = {"value": v, "unit": table.units.get(col, ""), "evidence": fact.id}
                elif isinstance(v, str) and col != "roi":
                    lines.append(f"- {_label(col)}: `{v}`")
                    items[col] = {"value": v}
            rows.append({"name": name, "items": items})
        sections.append({"title": table.name, "port": port, "source": origin, "rows": rows})
    return lines, sections


def _rule_lines(ev: Evidence, decimals: int) -> list[str]:
    lines = []
    for r in ev.rules:
        parts = [f"`{r.get('rule', '')}`"]
        for part in ("value", "threshold"):
            fid = r.get(f"{part}_id")
            parts.append(f"{part} {num(ev.facts[fid], decimals)}" if fid else f"{part} `{r.get(part)}`")
        parts.append("met" if r.get("passed") else "not met")
        lines.append("- rule " + ", ".join(parts))
    return lines


def cited_ids(text: str) -> list[str]:
    """Evidence ids linked in a text, in order."""
    return LINK.findall(text)


def evidence_list(text: str, ev: Evidence) -> list[dict[str, Any]]:
    """One entry per linked number of ``text``, in order: ``{value, raw, unit, node, field, key, id}``
    (``raw`` None and ``unresolved`` for an id the evidence does not have)."""
    out = []
    for m in LINKED_NUMBER.finditer(text):
        fid, f = m.group(3), ev.facts.get(m.group(3))
        if f is None:
            out.append({"value": float(m.group(1)), "raw": None, "unit": "", "id": fid, "unresolved": True})
            continue
        out.append({"value": float(m.group(1)), "raw": f.value, "unit": f.unit, "node": f.node, "field": f.field,
                    "key": f.key, "id": f.id})
    return out


def render_report(ev: Evidence, draft: Draft, title: str = "", decimals: int = 1,
                  meta: dict[str, Any] | None = None) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """(Markdown text, structured dict, evidence list) of a draft."""
    title = title or TITLES.get(ev.domain, TITLES["general"])
    header = header_of(ev.sources)
    lines = [f"# {title}", "", *header_lines(header), "", "## Findings", *draft.findings, "", "## Impression"]
    lines += [f"- {s}" for s in draft.impression]  # bullets: a list number would be an unlinked digit
    table_lines, sections = _table_lines(ev, decimals)
    if table_lines:
        lines += ["", f"## Measurements: {_APPENDIX.get(ev.domain, 'tables').lower()}", *table_lines]
    if draft.boxes:
        lines += ["", "## Lesion boxes (voxel index, min inclusive, max exclusive)"]
        origin = next((f"{f.node}.{f.field}" for f in ev.facts.values() if f.role == "slice"), "findings")
        for b in draft.boxes:
            (i0, j0, k0), (i1, j1, k1) = b.box_voxel
            lines.append(f"- `{b.lesion}`: `{i0}:{i1}, {j0}:{j1}, {k0}:{k1}` `[{origin}.{b.lesion}.box_voxel]`")
    rules = _rule_lines(ev, decimals)
    if rules:
        lines += ["", "## Decision rules", f"- conclusion: `{ev.label}`", *rules]
    linked = "\n".join(lines) + "\n"
    text, refs = footnoted(linked)
    text += "\n" + "\n".join(evidence_lines(refs)) + "\n" if refs else ""
    structured = {"header": header, "evidence_table": refs, "metadata_keys": list(METADATA_KEYS),
                  "title": title, "domain": ev.domain, "findings": list(draft.findings),
                  "impression": list(draft.impression), "label": ev.label, "label_evidence": ev.label_id,
                  "boxes": [b.model_dump() for b in draft.boxes], "plan": list(draft.plan), "source": draft.source,
                  "profile": ev.profile(), "sections": sections, "side": ev.side if ev.domain == "brain" else "",
                  "lesions": [{"id": e.id, "side": e.side, "zone": e.zone, "category": e.category,
                               "box_voxel": e.box_voxel, "box_world": e.box_world} for e in ev.lesions()],
                  **(meta or {})}
    keep_links = CODE.sub(lambda m: m.group(0) if m.group(0).startswith("`[") else "``", linked)
    return text, structured, evidence_list(keep_links, ev)


__all__ = ["TITLES", "cited_ids", "evidence_list", "render_report", "unit_text"]
