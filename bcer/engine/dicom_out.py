"""DICOM out for a case that came from DICOM: each mask as a DICOM SEG over the series it lies
on, and the case's measurements as one TID 1500 SR, under ``OUT/dicom/<case>/``.

The source series of a mask is the DICOM input whose grid it shares (shape and affine), else
its first DICOM input (the mask is then sampled onto that series by world coordinates).
Measurement groups: a table row whose region names a segment (``roi``/``label``/``region``)
references that segment; findings (lesions) are groups of their own with their size, volume
and ADC; a classification is a qualitative evaluation, plus its category as a number when the
label ends in one (``PI-RADS 3``).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..io.dicom_seg import read_source_series, write_seg
from ..io.dicom_sr import Group, Item, write_sr
from ..io.nifti import mask_label_names
from .derivatives import Finished, grid_input

log = logging.getLogger(__name__)
DICOM_DIR = "dicom"
# units of the findings' attributes (tables carry their own)
_FINDING_UNITS = {"volume_ml": "mL", "size_mm": "mm", "adc": "um2/s", "adc_mean": "um2/s", "adc_min": "um2/s"}
_REGION_KEYS = ("roi", "label", "region", "name")

__all__ = ["DICOM_DIR", "export_case", "measurement_groups"]


def _dicom_inputs(done: Finished, seqs: list[str]) -> list[tuple[str, dict[str, Any]]]:
    return [(s, done.inputs[s]) for s in seqs if done.inputs.get(s, {}).get("format") == "dicom"]


def _source_of(done: Finished, name: str) -> tuple[str, dict[str, Any]] | None:
    seq = grid_input(done, name, formats=("dicom",))
    if seq is not None:
        return seq, done.inputs[seq]
    cands = _dicom_inputs(done, done.used.get(name) or list(done.inputs)) or _dicom_inputs(done, list(done.inputs))
    return cands[0] if cands else None


def _sources(rec: dict[str, Any]) -> list[Any]:
    return read_source_series(rec["path"], (rec.get("options") or {}).get("series_uid"))


def _table_groups(name: str, doc: dict[str, Any], segments: dict[str, tuple[Any, int]]) -> list[Group]:
    units, groups = doc.get("units") or {}, []
    for i, row in enumerate(doc.get("rows", [])):
        region = next((str(row[k]) for k in _REGION_KEYS if isinstance(row.get(k), str)), None)
        items = [Item(c, float(v), units[c]) for c, v in row.items()
                 if c in units and isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)]
        seg, number = segments.get(region or "", (None, None))
        groups.append(Group(tracking_id=f"{name}.{region or i}", items=items, segment=number, seg=seg))
    return groups


def _finding_groups(doc: dict[str, Any]) -> list[Group]:
    groups = []
    for it in doc.get("items", []):
        values = {"volume_ml": it.get("volume_ml"), **(it.get("attributes") or {})}
        items = [Item(k, float(v), _FINDING_UNITS[k]) for k, v in values.items()
                 if k in _FINDING_UNITS and isinstance(v, (int, float)) and np.isfinite(v)]
        groups.append(Group(tracking_id=str(it.get("id")), items=items, finding=str(it.get("label") or "lesion")))
    return groups


def _class_group(name: str, doc: dict[str, Any]) -> Group:
    label = str(doc.get("label"))
    m = re.search(r"(\d+)\s*$", label)
    items = [Item(f"{name}_category", float(m.group(1)), "category")] if m else []
    return Group(tracking_id=name, items=items, qualitative={name: label})


def measurement_groups(done: Finished, segments: dict[str, tuple[Any, int]]) -> list[Group]:
    """The SR groups of a case's tables, findings and classifications."""
    groups: list[Group] = []
    for name, doc in done.docs.items():
        kind = doc.get("kind")
        if kind == "table":
            groups += _table_groups(name, doc, segments)
        elif kind == "findings":
            groups += _finding_groups(doc)
        elif kind == "classification":
            groups.append(_class_group(name, doc))
    return [g for g in groups if g.items or g.qualitative]


def export_case(out: str | Path, done: Finished, *, version: str = "0") -> list[Path]:
    """SEG per mask and one SR for a case with DICOM inputs; [] for a case without."""
    import nibabel as nib

    if not _dicom_inputs(done, list(done.inputs)):
        return []
    folder, written = Path(out) / DICOM_DIR / done.case.id, []
    segments: dict[str, tuple[Any, int]] = {}  # label name -> (SEG, segment number)
    first_sources = None
    for i, (name, path) in enumerate(done.masks.items()):
        mask = nib.load(str(path))
        src = _source_of(done, name)
        if src is None:
            continue
        sources = _sources(src[1])
        first_sources = first_sources or sources
        labels = mask_label_names(path)
        seg, numbers = write_seg(np.asarray(mask.dataobj), mask.affine, labels, sources,
                                 folder / f"{name}_seg.dcm", series_number=900 + i, version=version)
        written.append(folder / f"{name}_seg.dcm")
        for value, number in numbers.items():
            segments.setdefault(labels.get(value, f"label_{value}"), (seg, number))
    if first_sources is None:
        first_sources = _sources(_dicom_inputs(done, list(done.inputs))[0][1])
    groups = measurement_groups(done, segments)
    if groups:
        write_sr(groups, first_sources, folder / "measurements_sr.dcm", version=version)
        written.append(folder / "measurements_sr.dcm")
    return written
