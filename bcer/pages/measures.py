"""The key measurements of a cohort, as named series for the distribution charts.

Sources, cheapest first: the cohort rows' ``m_*`` measurement columns (tables and
classifications the engine already summarised), the bench's quality metrics (truth-based,
only when ground truth exists), and two small derived values read from JSON deliverables
(lesion counts from findings, the rigid transform's translation and rotation). No volume is
read: a cohort page must render in seconds for hundreds of cases.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .load import CohortView

# (pattern on the measurement key, title, unit); first match names a series
KEY_MEASURES: list[tuple[str, str, str]] = [
    (r"^function\.lv_ef_pct$", "LV ejection fraction", "%"),
    (r"^function\.lv_edv_ml$", "LV end-diastolic volume", "mL"),
    (r"^function\.lv_esv_ml$", "LV end-systolic volume", "mL"),
    (r"^function\.rv_ef_pct$", "RV ejection fraction", "%"),
    (r"^function\.myo_mass_g$", "myocardial mass", "g"),
    (r"^features\.gland\.volume_ml$", "gland volume", "mL"),
    (r"^features\.(enhancing|oedema|necrotic_core|whole_tumour|wt|tc|et)\.volume_ml$", "{0} volume", "mL"),
    (r"^grade\.score\.whole_tumour_ml$", "whole tumour volume", "mL"),
    (r"^derived\.lesions$", "lesions per case", "count"),
    (r"^derived\.translation_mm$", "registration translation", "mm"),
    (r"^derived\.rotation_deg$", "registration rotation", "deg"),
    (r"^quality\.(.+)$", "{0} (vs truth)", ""),
    (r"^duration_s$", "case wall time", "s"),
]


@dataclass
class Series:
    key: str
    title: str
    unit: str
    values: dict[str, float] = field(default_factory=dict)  # case -> value


def _by_roi(m: dict[str, Any]) -> dict[str, Any]:
    """Multi-row tables arrive keyed by row index (``features.0.volume_ml`` with ``features.0.roi``);
    key them by their ``roi`` instead, and one-row tables by their own ``roi``."""
    out = dict(m)
    for k, v in m.items():
        hit = re.match(r"^(.+?)\.(?:(\d+)\.)?roi$", k)
        if hit and isinstance(v, str):
            prefix = f"{hit.group(1)}.{hit.group(2)}." if hit.group(2) else f"{hit.group(1)}."
            for k2, v2 in m.items():
                if k2.startswith(prefix) and not k2.endswith(".roi"):
                    out[f"{hit.group(1)}.{v}.{k2[len(prefix):]}"] = v2
    return out


def _deliverable_file(cv: CohortView, row: dict[str, Any], names: tuple[str, ...]) -> Path | None:
    deliv = row.get("deliverables") or {}
    if isinstance(deliv, str):
        try:
            deliv = json.loads(deliv)
        except ValueError:
            deliv = {}
    for name in names:
        rel = deliv.get(name)
        if rel:
            p = Path(rel)
            return p if p.is_absolute() else (cv.root / p if (cv.root / p).exists() else cv.root.parent / p)
    return None


def _derived(cv: CohortView, row: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    findings = _deliverable_file(cv, row, ("findings", "lesions"))
    if findings and findings.exists():
        try:
            out["derived.lesions"] = float(len(json.loads(findings.read_text()).get("items", [])))
        except (OSError, ValueError, AttributeError):
            pass
    transform = _deliverable_file(cv, row, ("transform",))
    if transform and transform.exists():
        try:
            import numpy as np

            m = np.asarray(json.loads(transform.read_text())["matrix"], float)
            out["derived.translation_mm"] = float(np.linalg.norm(m[:3, 3]))
            out["derived.rotation_deg"] = float(np.degrees(np.arccos(np.clip((np.trace(m[:3, :3]) - 1) / 2, -1, 1))))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return out


def case_values(cv: CohortView, row: dict[str, Any]) -> dict[str, float]:
    """Every numeric measurement of one case under a flat key (``function.lv_ef_pct``, ...)."""
    m = {k[2:]: v for k, v in row.items() if k.startswith("m_")}
    m = _by_roi(m)
    m.update(_derived(cv, row))
    for k, v in (cv.quality.get(row.get("case"), {}) or {}).items():
        m[f"quality.{k}"] = v
    m["duration_s"] = row.get("duration_s")
    return {k: float(v) for k, v in m.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None and math.isfinite(v)}


def cohort_series(cv: CohortView, limit: int = 12) -> list[Series]:
    """The key measurement series of a cohort, in ``KEY_MEASURES`` order (at most ``limit``)."""
    found: dict[str, Series] = {}
    for row in cv.rows:
        for key, value in case_values(cv, row).items():
            for pattern, title, unit in KEY_MEASURES:
                hit = re.match(pattern, key)
                if hit:
                    if key not in found:
                        found[key] = Series(key, title.format(*hit.groups()).replace("_", " "), unit)
                    found[key].values[str(row.get("case"))] = value
                    break
    order = {p: i for i, (p, _, _) in enumerate(KEY_MEASURES)}
    ranked = sorted(found.values(), key=lambda s: (next(order[p] for p in order if re.match(p, s.key)), s.key))
    return [s for s in ranked if s.values][:limit]


__all__ = ["KEY_MEASURES", "Series", "case_values", "cohort_series"]
