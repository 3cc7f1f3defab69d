"""BraTS 2018-2021 layout: ``Brats18_<ID>/Brats18_<ID>_{t1,t1ce,t2,flair,seg}.nii.gz``
(2021: ``BraTS2021_<ID>/BraTS2021_<ID>_...``). BraTS 2023 and later are ``brats2023``.

Reads the real training/validation folders (flat, or under ``HGG/`` and ``LGG/``, whose
names then give the grade) and the optional ``survival_data.csv`` (age, survival). Writes
phantom cohorts flat (no grade in the path, so a grade classifier cannot read it) with a
``bcer_truth.json`` sidecar per case; clean reference volumes go to ``..._ref_<seq>.nii.gz``
and extra label maps to ``..._<name>mask.nii.gz``, names that readers of real data ignore.
"""
from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.sequences import canonical_sequence
from ..phantom import Phantom
from ._common import (read_each, read_truth, ref_for, sanitize_case_id,
                      validate_case_shapes, write_truth, write_volume)

log = logging.getLogger(__name__)

NAME = "brats"
PREFIX = "Brats18_"
FILE_KEYS = {"T1": "t1", "T1c": "t1ce", "T2": "t2", "FLAIR": "flair"}
SEG_LABELS = {1: "necrotic_core", 2: "oedema", 4: "enhancing"}
_GRADE_DIRS = ("HGG", "LGG")

__all__ = ["NAME", "detect", "write", "read", "case_dirs"]


def _is_case_dir(d: Path) -> bool:
    return d.is_dir() and d.name.lower().startswith("brats") and any(
        (d / f"{d.name}_{k}.nii.gz").exists() or (d / f"{d.name}_{k}.nii").exists()
        for k in (*FILE_KEYS.values(), "seg"))


def case_dirs(root: Path) -> list[tuple[Path, str | None]]:
    """Case folders under ``root`` (directly or in HGG/LGG), each with the grade its parent
    folder states (None when flat)."""
    root = Path(root)
    if _is_case_dir(root):  # pointed at one case folder
        return [(root, root.parent.name if root.parent.name in _GRADE_DIRS else None)]
    found: list[tuple[Path, str | None]] = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if d.name in _GRADE_DIRS:
            found += [(c, d.name) for c in sorted(d.iterdir()) if _is_case_dir(c)]
        elif _is_case_dir(d):
            found.append((d, None))
    return found


def detect(root: Path) -> bool:
    root = Path(root)
    return root.is_dir() and bool(case_dirs(root))


def _folder_name(case_id: str) -> str:
    cid = sanitize_case_id(case_id)
    return cid if cid.startswith(PREFIX) else PREFIX + cid


def _write_case(p: Phantom, out: Path) -> None:
    name = _folder_name(p.case_id)
    d = out / name
    for seq, key in FILE_KEYS.items():
        if seq not in p.sequences:
            raise ToolError(ErrorCode.input_missing, f"phantom {p.case_id} has no {seq} for BraTS",
                            hint=f"BraTS needs {sorted(FILE_KEYS)}", case=p.case_id)
        write_volume(p.sequences[seq], d / f"{name}_{key}.nii.gz")
    written = {seq: d / f"{name}_{key}.nii.gz" for seq, key in FILE_KEYS.items()}
    labels: dict[str, SequenceRef] = {}
    for lname, mask in p.labels.items():
        fname = f"{name}_seg.nii.gz" if lname == "seg" else f"{name}_{lname}mask.nii.gz"
        labels[lname] = write_volume(mask, d / fname)
    refs = {}
    for seq, img in p.references.items():
        if seq in written and np.array_equal(np.asarray(img.data), np.asarray(p.sequences[seq].data)):
            refs[seq] = ref_for(written[seq].resolve(), img)  # clean input: no second copy
        else:
            refs[seq] = write_volume(img, d / f"{name}_ref_{FILE_KEYS.get(seq, seq.lower())}.nii.gz")
    write_truth(d, p, labels, refs)


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write phantoms as BraTS 2018 case folders under ``out``; returns ``read(out)``'s cases
    for exactly the written ones."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for p in phantoms:
        _write_case(p, out)
        names.append(_folder_name(p.case_id))
    by_id = {c.id: c for c in read(out)}
    return [by_id[n] for n in names]


def _survival(root: Path) -> dict[str, dict[str, Any]]:
    """Per-case rows of BraTS 2018's ``survival_data.csv`` (Age, Survival, ResectionStatus)."""
    path = root / "survival_data.csv"
    if not path.exists():
        return {}
    rows: dict[str, dict[str, Any]] = {}
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            cid = r.get("BraTS18ID") or r.get("Brats18ID") or ""
            meta: dict[str, Any] = {}
            for key, out_key in (("Age", "age"), ("Survival", "survival_days")):
                try:
                    meta[out_key] = float(r[key]) if r.get(key) not in (None, "", "NA") else None
                except ValueError:
                    meta[out_key] = r[key]
            if r.get("ResectionStatus"):
                meta["resection_status"] = r["ResectionStatus"]
            rows[cid] = meta
    return rows


def _find(d: Path, key: str) -> Path | None:
    for ext in (".nii.gz", ".nii"):
        p = d / f"{d.name}_{key}{ext}"
        if p.exists():
            return p
    return None


def _read_case(d: Path, grade: str | None, survival: dict[str, dict[str, Any]]) -> Case:
    sequences = {}
    for key in FILE_KEYS.values():
        p = _find(d, key)
        if p is not None:
            sequences[canonical_sequence(key)] = ref_for(p.resolve(), kind="image")
    truth = read_truth(d)
    metadata: dict[str, Any] = dict(survival.get(d.name, {}))
    gt: dict[str, Any] | None = None
    if truth is not None:
        metadata.update(truth["metadata"])
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    else:
        seg = _find(d, "seg")
        values = {"grade": grade} if grade else {}
        if seg is not None or values:
            labels = ({"seg": ref_for(seg.resolve(), kind="mask", labels=SEG_LABELS).model_dump(mode="json")}
                      if seg is not None else {})
            gt = {"values": values, "labels": labels, "references": {}}
    case = Case(id=sanitize_case_id(d.name), root=str(d.resolve()), domain="brain",
                sequences=sequences, metadata=metadata, ground_truth=gt, layout=NAME)
    validate_case_shapes(case)
    return case


def read(root: Path) -> list[Case]:
    """Every BraTS case under ``root`` as a lazy ``Case`` (headers are checked, arrays are not
    loaded).

    Raises:
        ToolError: ``input_missing`` (no cases), ``schema`` (unreadable header or sidecar),
            ``shape`` (a file not 3-D, or files of one case on different grids).
    """
    root = Path(root)
    dirs = case_dirs(root) if root.is_dir() else []
    if not dirs:
        raise ToolError(ErrorCode.input_missing, f"no BraTS case folders under {root}",
                        hint="expected Brats18_<ID>/Brats18_<ID>_t1.nii.gz ... (BraTS 2023+ folders, "
                        "BraTS-GLI-00000-000/...-t1n.nii.gz, are layout brats2023)", file=str(root))
    top = root
    if _is_case_dir(root):  # the csv sits at the dataset root, above HGG/ and LGG/
        top = root.parent.parent if root.parent.name in _GRADE_DIRS else root.parent
    survival = _survival(top)
    return read_each(dirs, lambda x: _read_case(x[0], x[1], survival), lambda x: x[0].name,
                     lambda x: x[0], domain="brain", layout=NAME)
