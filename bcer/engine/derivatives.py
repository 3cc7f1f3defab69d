"""What a finished case left for export, and its flat predictions.

The standard derivatives of a cohort (``engine.exports.write_derivatives``) are built from
what each finished case left in ``OUT/<case>/``: ``provenance.json`` names every
deliverable, its files and the input files it came from, and masks carry their label names
in the NIfTI header. This module reads that (:func:`finished_cases`), finds the input a mask
shares its grid with (:func:`grid_input`), maps label values to the input dataset's own
(:func:`label_mapping`: BraTS 2023's ET is 3, 2018-2021's is 4) and writes the flat
``OUT/predictions/<case>.nii.gz`` files (:func:`write_predictions`).
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.case import Case
from ..contracts.errors import ToolError
from ..io.nifti import mask_label_names

log = logging.getLogger(__name__)
PREDICTIONS_DIR = "predictions"

__all__ = ["Finished", "finished_cases", "grid_input", "label_mapping", "nifti_bytes", "remap", "write_predictions"]


@dataclass
class Finished:
    """One case's exportable outputs, read from its folder."""
    case: Case
    folder: Path
    masks: dict[str, Path] = field(default_factory=dict)  # deliverable -> NIfTI
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)  # deliverable -> its JSON (table, findings, ...)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # sequence -> input record
    used: dict[str, list[str]] = field(default_factory=dict)  # deliverable -> sequences it came from


def _is_mask(path: Path) -> bool:
    import nibabel as nib

    img = nib.load(str(path))
    return bool(mask_label_names(path)) or (np.issubdtype(img.get_data_dtype(), np.integer) and len(img.shape) == 3)


def _read_one(out: Path, case: Case) -> Finished | None:
    folder = out / case.id
    prov_path = folder / "provenance.json"
    if not (folder / "_DONE").exists() or not prov_path.exists():
        return None
    prov = json.loads(prov_path.read_text())
    done = Finished(case=case, folder=folder)
    for name, d in prov.get("deliverables", {}).items():
        done.inputs.update({k: v for k, v in (d.get("inputs") or {}).items() if v})
        done.used[name] = sorted(k for k, v in (d.get("inputs") or {}).items() if v)
        files = [folder / f for f in d.get("files", {})]
        nifti = [f for f in files if f.name.endswith((".nii", ".nii.gz")) and f.exists()]
        if nifti and _is_mask(nifti[0]):
            done.masks[name] = nifti[0]
            continue
        js = [f for f in files if f.suffix == ".json" and f.exists()]
        if js:
            doc = json.loads(js[0].read_text())
            if isinstance(doc, dict) and doc.get("kind") in ("table", "findings", "classification"):
                done.docs[name] = doc
    return done


def finished_cases(out: str | Path, cases: Iterable[Case]) -> list[Finished]:
    """The cases of ``cases`` that finished (``_DONE``) under ``out``, with their outputs."""
    found = []
    for case in cases:
        try:
            one = _read_one(Path(out), case)
        except (OSError, ValueError) as e:  # a damaged folder: the rest still export
            log.warning("derivatives: cannot read the outputs of %s: %s", case.id, e)
            continue
        if one is not None:
            found.append(one)
    return found


def _grid_of(rec: dict[str, Any]) -> tuple[tuple[int, ...], np.ndarray] | None:
    """Shape and affine of an input (a NIfTI's header alone; other formats through their reader)."""
    import nibabel as nib

    from ..contracts.case import SequenceRef
    from ..io import load_sequence

    try:
        if rec.get("format", "nifti") == "nifti" and str(rec["path"]).endswith((".nii", ".nii.gz")):
            img = nib.load(rec["path"])
            return tuple(img.shape[:3]), np.asarray(img.affine)
        art = load_sequence(SequenceRef(path=rec["path"], format=rec["format"], kind=rec.get("kind", "image"),
                                        options=rec.get("options") or {}))
        return tuple(art.data.shape[:3]), np.asarray(art.affine)
    except (ToolError, OSError, ValueError, KeyError) as e:  # unreadable now: not a grid match
        log.debug("derivatives: no grid for %s: %s", rec.get("path"), e)
        return None


def grid_input(done: Finished, name: str, formats: tuple[str, ...] | None = None) -> str | None:
    """The input sequence whose grid (shape, affine) the mask ``name`` shares, if any."""
    import nibabel as nib

    mask = nib.load(str(done.masks[name]))
    for seq in done.used.get(name) or list(done.inputs):
        rec = done.inputs.get(seq, {})
        if formats is not None and rec.get("format") not in formats:
            continue
        grid = _grid_of(rec) if rec.get("path") else None
        if grid and grid[0] == tuple(mask.shape[:3]) and np.allclose(grid[1], mask.affine, atol=1e-3):
            return seq
    return None


def _norm(name: str) -> str:
    """A label name as the tumour compartment it means (``ET``, ``enhancing tumour`` -> ``enhancing``:
    the one name table, ``brats2023.compartment``), else the name itself."""
    # imported here: the dataset package loads the phantom generators, which a cohort's export never needs
    from ..datasets.layouts.brats2023 import compartment

    return compartment(name) or re.sub(r"[^a-z0-9]", "", str(name).lower())


def _truth_labels(case: Case) -> list[dict[int, str]]:
    """The label tables of the case's ground truth, else the table its layout declares
    (``SEG_LABELS``: a BraTS 2023 test case without a seg still gets ET = 3)."""
    refs = (case.ground_truth or {}).get("labels", {}) or {}
    tables = [{int(k): str(v) for k, v in ((r.get("options") or {}).get("labels") or {}).items()}
              for r in refs.values() if isinstance(r, dict)]
    tables = [t for t in tables if t]
    if not tables and case.layout:
        from ..datasets.layouts import get_layout

        try:
            declared = getattr(get_layout(case.layout), "SEG_LABELS", None)
        except (ToolError, KeyError, ValueError):
            declared = None
        tables = [dict(declared)] if declared else []
    return tables


def label_mapping(predicted: dict[int, str], case: Case) -> dict[int, int]:
    """Predicted value -> the value the input dataset uses for that region, matched by name:
    BraTS 2021's ET is 4, BraTS 2023's is 3. Identity where the dataset names no such region
    or has no label table."""
    for table in _truth_labels(case):
        by_name = {_norm(n): v for v, n in table.items()}
        mapping = {v: by_name[_norm(n)] for v, n in predicted.items() if _norm(n) in by_name}
        if mapping:
            return {v: mapping.get(v, v) for v in predicted}
    return {v: v for v in predicted}


def _main_mask(done: Finished) -> str | None:
    """The deliverable that is the case's prediction: the mask with the most labels."""
    if not done.masks:
        return None
    return max(done.masks, key=lambda n: (len(mask_label_names(done.masks[n])), -list(done.masks).index(n)))


def remap(path: Path, mapping: dict[int, int]) -> Any:
    """The mask at ``path`` as a nibabel image with its values mapped (header, affine kept)."""
    import nibabel as nib

    img = nib.load(str(path))
    data = np.asarray(img.dataobj)
    if any(k != v for k, v in mapping.items()):
        lut = data.copy()
        for src, dst in mapping.items():
            lut[data == src] = dst
        data = lut
    new = nib.Nifti1Image(data.astype(np.int16), img.affine, img.header)
    new.header.set_xyzt_units("mm", "sec")
    return new


def write_predictions(out: str | Path, finished: Iterable[Finished]) -> list[Path]:
    """``OUT/predictions/<case>.nii.gz``: each case's main mask in its dataset's label values
    (the flat layout nnU-Net's and the BraTS evaluation scripts read)."""
    from ..io.nifti import atomic_write_bytes

    written = []
    for done in finished:
        name = _main_mask(done)
        if name is None:
            continue
        img = remap(done.masks[name], label_mapping(mask_label_names(done.masks[name]), done.case))
        path = Path(out) / PREDICTIONS_DIR / f"{done.case.id}.nii.gz"
        written.append(atomic_write_bytes(path, nifti_bytes(img)))
    return written


def nifti_bytes(img: Any) -> bytes:
    import gzip

    return gzip.compress(img.to_bytes(), compresslevel=6, mtime=0)
