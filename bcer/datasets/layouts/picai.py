"""PI-CAI: ``<patient>/<patient>_<study>_{t2w,adc,hbv,cor,sag}.mha`` (one case per study).

The public images (``picai_public_images_fold0..4``) hold one folder per patient; each study is
a case ``<patient>_<study>`` with axial T2w, ADC (10^-6 mm^2/s), the high-b-value DWI
(``hbv``) and coronal/sagittal T2w (``T2w_cor``, ``T2w_sag``: kept, not needed by any task).
The labels come separately (the ``picai_labels`` repository); when a ``picai_labels`` folder
sits in or beside the dataset folder, each study's csPCa lesion mask ``<patient>_<study>.nii.gz``
(on the axial T2w grid) becomes the ground truth, preferring the human-expert resampled
delineations over the AI-derived ones. Its connected components become the lesion truth the
benchmark scores findings against (``values.lesions``: T2w voxel box, world box, side, volume),
so ``prostate_report`` cases get lesion sensitivity and false positives; a study whose mask is
empty has ``lesions == []``. ``clinical_information/marksheet.csv`` adds age, PSA, PSA density
and prostate volume to the metadata and ``case_csPCa``/``case_ISUP`` to the truth values.

Phantom cohorts written here add a truth sidecar per study under
``<patient>/bcer_truth/<case>/``, which readers of real data never look at.
"""
from __future__ import annotations

import csv
import logging
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...io import sequence_header, write_nifti
from ...io.itk import write_itk
from ..phantom import Phantom
from ._common import read_each, read_truth, ref_for, write_truth

log = logging.getLogger(__name__)

NAME = "picai"
FILE_KEYS = {"t2w": "T2w", "adc": "ADC", "hbv": "DWI", "cor": "T2w_cor", "sag": "T2w_sag"}
FILE_RX = re.compile(r"(?P<patient>[A-Za-z0-9]+)_(?P<study>[A-Za-z0-9]+)_(?P<key>t2w|adc|hbv|cor|sag)\.mha")
LABELS_DIR = "picai_labels"
TRUTH_DIR = "bcer_truth"
# preferred label sources, best first (path parts of the picai_labels repository)
_LABEL_PREFERENCE = (("human_expert", "resampled"), ("human_expert",), ("AI",), ())
_MARKSHEET_META = {"patient_age": "age", "psa": "psa", "psad": "psa_density", "prostate_volume": "prostate_volume_ml"}

__all__ = ["NAME", "FILE_KEYS", "detect", "read", "write", "lesions_from_mask"]


# ---- finding cases --------------------------------------------------------------------------
def _studies(patient_dir: Path) -> dict[str, dict[str, Path]]:
    out: dict[str, dict[str, Path]] = {}
    for p in sorted(patient_dir.iterdir()):
        m = FILE_RX.fullmatch(p.name)
        if m and p.is_file() and m.group("patient") == patient_dir.name:
            out.setdefault(f"{m.group('patient')}_{m.group('study')}", {})[FILE_KEYS[m.group("key")]] = p
    return out


def _patient_dirs(root: Path) -> list[Path]:
    if root.is_dir() and _studies(root):
        return [root]
    return [d for d in sorted(root.iterdir()) if d.is_dir() and d.name != LABELS_DIR and _studies(d)]


def detect(root: Path) -> bool:
    root = Path(root)
    return root.is_dir() and bool(_patient_dirs(root))


# ---- labels and clinical information -----------------------------------------------------------
def _labels_root(root: Path) -> Path | None:
    for cand in (root / LABELS_DIR, root.parent / LABELS_DIR, root.parent.parent / LABELS_DIR):
        if cand.is_dir():
            return cand
    return None


def _label_index(labels_root: Path | None) -> dict[str, Path]:
    """``<patient>_<study>`` -> its lesion mask, the preferred source when several exist."""
    if labels_root is None:
        return {}
    ranked: dict[str, tuple[int, Path]] = {}
    for p in labels_root.rglob("*.nii.gz"):
        parts = set(p.relative_to(labels_root).parts[:-1])
        rank = next(i for i, want in enumerate(_LABEL_PREFERENCE) if set(want) <= parts)
        cid = p.name[: -len(".nii.gz")]
        if cid not in ranked or rank < ranked[cid][0]:
            ranked[cid] = (rank, p)
    return {cid: p for cid, (_, p) in ranked.items()}


def _marksheet(labels_root: Path | None) -> dict[str, dict[str, Any]]:
    path = None if labels_root is None else next(labels_root.rglob("marksheet.csv"), None)
    if path is None:
        return {}
    rows: dict[str, dict[str, Any]] = {}
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            meta: dict[str, Any] = {}
            for col, key in _MARKSHEET_META.items():
                try:
                    meta[key] = float(r[col]) if r.get(col) not in (None, "", "NaN", "nan") else None
                except ValueError:
                    meta[key] = None
            values = {k: r[k] for k in ("case_csPCa", "case_ISUP") if r.get(k) not in (None, "")}
            rows[f"{r.get('patient_id')}_{r.get('study_id')}"] = {"metadata": meta, "values": values}
    return rows


def lesions_from_mask(data: np.ndarray, affine: np.ndarray) -> list[dict[str, Any]]:
    """One lesion record per connected component (26-neighbourhood) of ``data > 0``: ``box_voxel``
    (inclusive min, exclusive max), ``box_world`` (RAS box of its voxel centres), ``centroid_world``,
    ``side`` (sign of the centroid's RAS x), ``volume_ml`` and ``isup`` (the largest label value
    inside, when the mask stores grades rather than 0/1)."""
    from scipy import ndimage

    comps, n = ndimage.label(np.asarray(data) > 0, structure=np.ones((3, 3, 3), bool))
    voxel_ml = abs(float(np.linalg.det(np.asarray(affine)[:3, :3]))) / 1000.0
    out = []
    for i in range(1, n + 1):
        ijk = np.argwhere(comps == i)
        world = ijk @ np.asarray(affine)[:3, :3].T + np.asarray(affine)[:3, 3]
        centroid = world.mean(axis=0)
        peak = int(np.asarray(data)[comps == i].max())
        rec = {"id": i, "label": i, "side": "R" if centroid[0] > 0 else "L", "volume_ml": float(len(ijk) * voxel_ml),
               "box_voxel": [ijk.min(axis=0).tolist(), (ijk.max(axis=0) + 1).tolist()],
               "box_world": [world.min(axis=0).tolist(), world.max(axis=0).tolist()],
               "centroid_world": centroid.tolist()}
        if peak > 1:
            rec["isup"] = peak
        out.append(rec)
    return out


def _lesion_truth(cid: str, label: Path, t2w: SequenceRef) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(label ref dict, lesion records) for a study's mask, checked against the T2w grid."""
    from ...io import load_sequence

    ref = ref_for(label.resolve(), kind="mask", labels={1: "csPCa"})
    mask = load_sequence(ref)
    want = tuple(sequence_header(t2w)["shape"])
    if tuple(mask.data.shape) != want:
        raise ToolError(ErrorCode.shape, f"case {cid}: lesion mask {label.name} has grid {tuple(mask.data.shape)}, "
                        f"the axial T2w {want}", hint="use the masks resampled to T2w "
                        "(picai_labels/csPCa_lesion_delineations/human_expert/resampled)", case=cid, file=str(label))
    return ref.model_dump(mode="json"), lesions_from_mask(mask.data, mask.affine)


# ---- reading --------------------------------------------------------------------------------------
def _read_case(patient_dir: Path, cid: str, files: dict[str, Path], labels: dict[str, Path],
               clinical: dict[str, dict[str, Any]]) -> Case:
    missing = [f"{cid}_{k}.mha" for k, n in FILE_KEYS.items() if n in ("T2w", "ADC", "DWI") and n not in files]
    if missing:
        raise ToolError(ErrorCode.input_missing, f"case {cid} lacks {missing} (prostate_report needs T2w, ADC "
                        "and hbv)", case=cid, file=str(patient_dir / missing[0]))
    sequences = {n: ref_for(p.resolve(), kind="image", fmt="itk") for n, p in sorted(files.items())}
    row = clinical.get(cid, {})
    metadata = {k: v for k, v in row.get("metadata", {}).items() if v is not None}
    truth = read_truth(patient_dir / TRUTH_DIR / cid) if (patient_dir / TRUTH_DIR / cid).is_dir() else None
    gt = None
    if truth is not None:
        metadata.update(truth["metadata"])
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    elif cid in labels:
        ref, lesions = _lesion_truth(cid, labels[cid], sequences["T2w"])
        gt = {"values": {**row.get("values", {}), "lesions": lesions}, "labels": {"lesions": ref}, "references": {}}
    elif row.get("values"):
        gt = {"values": dict(row["values"]), "labels": {}, "references": {}}
    case = Case(id=cid, root=str(patient_dir.resolve()), domain="prostate", sequences=sequences,
                metadata=metadata, ground_truth=gt, layout=NAME)
    _check_diffusion_grid(case)
    return case


def _check_diffusion_grid(case: Case) -> None:
    """ADC and hbv come from one diffusion acquisition: one grid (T2w has its own)."""
    a, d = (sequence_header(case.sequences[n])["shape"] for n in ("ADC", "DWI"))
    if tuple(a) != tuple(d):
        raise ToolError(ErrorCode.shape, f"case {case.id}: hbv has grid {tuple(d)} but ADC has {tuple(a)}",
                        hint="ADC and hbv of one study share a grid", case=case.id, file=case.sequences["DWI"].path)


def read(root: Path) -> list[Case]:
    """Every PI-CAI study under ``root`` as a lazy Case (headers read; lesion masks, when
    present, are read to derive the lesion truth).

    Raises:
        ToolError: ``input_missing`` (no study, or a study lacking t2w/adc/hbv), ``schema``
            (unreadable file), ``shape`` (ADC and hbv on different grids, or a lesion mask
            off the T2w grid), each naming the case and the file.
    """
    root = Path(root)
    dirs = _patient_dirs(root) if root.is_dir() else []
    if not dirs:
        raise ToolError(ErrorCode.input_missing, f"no PI-CAI patient folders under {root}", file=str(root),
                        hint="expected <patient>/<patient>_<study>_t2w.mha, _adc.mha, _hbv.mha")
    top = root.parent if dirs == [root] else root
    labels_root = _labels_root(top)
    labels, clinical = _label_index(labels_root), _marksheet(labels_root)
    items = [(d, cid, files) for d in dirs for cid, files in _studies(d).items()]
    return read_each(items, lambda x: _read_case(x[0], x[1], x[2], labels, clinical), lambda x: x[1],
                     lambda x: x[0], domain="prostate", layout=NAME)


# ---- writing (phantom cohorts) ----------------------------------------------------------------------
def write(phantoms: Iterable[Phantom], out: Path, truth_sidecar: bool = True) -> list[Case]:
    """Write prostate phantoms as PI-CAI studies (patient ``1<n:04d>``, study ``<n+1:07d>``),
    lesion masks under ``picai_labels/csPCa_lesion_delineations/human_expert/resampled``;
    returns the read-back Cases in order. ``truth_sidecar=False`` writes what a real download
    holds (the lesion truth then comes from the masks)."""
    out = Path(out)
    names = []
    for n, p in enumerate(phantoms):
        patient, study = f"1{n:04d}", f"{n + 1:07d}"
        cid = f"{patient}_{study}"
        for key, seq in (("t2w", "T2w"), ("adc", "ADC"), ("hbv", "DWI")):
            write_itk(p.sequences[seq], out / patient / f"{cid}_{key}.mha")
        lab = out / LABELS_DIR / "csPCa_lesion_delineations" / "human_expert" / "resampled" / f"{cid}.nii.gz"
        lesions = p.labels["lesions"]
        write_nifti(type(lesions)((np.asarray(lesions.data) > 0).astype(np.int16), lesions.affine, {}, {1: "csPCa"}),
                    lab)
        if truth_sidecar:
            write_truth(out / patient / TRUTH_DIR / cid, p,
                        {"lesions": ref_for(lab.resolve(), kind="mask", labels={1: "csPCa"})})
        names.append(cid)
    by_id = {c.id: c for c in read(out)}
    return [by_id[n] for n in names]
