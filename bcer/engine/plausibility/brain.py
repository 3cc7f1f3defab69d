"""Checks of brain tumour deliverables: BraTS labels, tumour inside the brain, nested
compartments, volumes that agree across the label map, the features table and the grade."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import ndimage

from ...metrics import dice
from ...tools.skull import strip_skull
from .core import Inputs, Unavailable, Verdict, Volume, check, grid_points, number, world_to_voxel


class LabelParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[int] = Field(default_factory=lambda: [1, 2, 4],
                              description="tumour labels (BraTS 2018-2021: 1 necrotic core, 2 oedema, 4 enhancing)")


@check("brats_labels", LabelParams)
def brats_labels(x: Inputs, p: LabelParams) -> Verdict:
    """The label map uses only the BraTS tumour labels (1 necrotic/non-enhancing core, 2
    oedema, 4 enhancing tumour; Menze et al., IEEE TMI 2015; Bakas et al., 2018). Value: the
    number of voxels with any other label."""
    data = np.asarray(x.nifti().data)
    if data.ndim != 3:
        raise Unavailable(f"label map has shape {data.shape}; need 3-D")
    values, counts = np.unique(data, return_counts=True)
    other = {int(v): int(c) for v, c in zip(values, counts) if v != 0 and int(v) not in p.labels}
    n = float(sum(other.values()))
    limit = f"labels ⊆ {sorted(p.labels)}"
    if other:
        return Verdict(False, n, limit, f"{n:.0f} voxels carry labels {sorted(other)} outside {sorted(p.labels)}")
    return Verdict(True, 0.0, limit, f"labels {sorted(int(v) for v in values if v != 0)}")


class BrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sequence: list[str] = Field(default_factory=lambda: ["T1", "T1c", "T2", "FLAIR"])
    min_inside: float = Field(0.95, ge=0, le=1, description="share of tumour voxels (or ROI centroids) inside the brain")
    max_brain_fraction: float = Field(0.5, gt=0, le=1, description="whole tumour at most this share of the brain")
    margin_mm: float = Field(2.0, ge=0, description="the brain mask is grown by this much (partial-volume rim)")


def brain_mask(vol: Volume, others: Callable[[], list[Volume]] | None = None) -> tuple[np.ndarray, str]:
    """The brain on ``vol``'s grid. Skull-stripped inputs (BraTS: background exactly 0) give it
    directly; otherwise the head (signal above 10 % of the 99th percentile) is cut to the
    region inside its dark bone shell (:func:`bcer.tools.skull.strip_skull`, from ``vol`` and
    the ``others`` on its grid, read only then), or stands in whole when no shell is found."""
    data = np.asarray(vol.data)
    if data.ndim != 3:
        raise Unavailable(f"input has shape {data.shape}; need 3-D")
    if float(np.mean(data == 0)) >= 0.05:
        return ndimage.binary_fill_holes(data != 0), "non-zero voxels of the skull-stripped input"
    head = ndimage.binary_fill_holes(data > 0.1 * np.percentile(data, 99))
    more = [np.asarray(v.data, np.float64) for v in (others() if others else []) if v is not vol]
    stack = np.stack([data.astype(np.float64)] + [m for m in more if m.shape == data.shape])
    strip = strip_skull(stack, head)
    if strip.stripped:
        return strip.brain, f"brain inside the bone shell of the head, from {len(stack)} contrast(s)"
    return head, f"head mask (input is not skull-stripped; {strip.reason})"


def inside_mask(mask: np.ndarray, affine: np.ndarray, points: np.ndarray, margin_vox: int) -> np.ndarray:
    """Whether each world point falls in ``mask`` grown by ``margin_vox`` voxels. The growing
    is done on the points' bounding box only (a full-size brain mask is 9 M voxels)."""
    ijk = np.rint(world_to_voxel(affine, points)).astype(np.int64)
    shape = np.asarray(mask.shape)
    lo = np.clip(ijk.min(0) - margin_vox - 1, 0, shape)
    hi = np.clip(ijk.max(0) + margin_vox + 2, 0, shape)
    crop = mask[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]]
    if margin_vox and crop.size:
        crop = ndimage.binary_dilation(crop, iterations=margin_vox)
    local = ijk - lo
    ok = np.all((local >= 0) & (local < np.asarray(crop.shape)), axis=1) & np.all((ijk >= 0) & (ijk < shape), axis=1)
    out = np.zeros(len(points), bool)
    out[ok] = crop[tuple(local[ok].T)]
    return out


def _contrasts(x: Inputs, names: list[str]) -> list[Volume]:
    """Every sequence of ``names`` the case has (the skull strip reads them all)."""
    out: list[Volume] = []
    for name in names:
        try:
            out.append(x.sequence(name))
        except Unavailable:
            continue
    return out


@check("tumour_in_brain", BrainParams)
def tumour_in_brain(x: Inputs, p: BrainParams) -> Verdict:
    """The tumour lies inside the brain: at least 95 % of its voxels (a label map or mask
    deliverable), or every ROI centroid (a features table), inside the brain mask of the
    input (grown by 2 mm for the partial-volume rim; the centroids of the rows and of every
    focus of ``meta["whole"]``, the tumour's separate foci), and the whole tumour is at most half
    the brain volume (our choice: a "tumour" that large is a mask that leaked). Value: the
    share inside."""
    inp = x.sequence(p.sequence)
    brain, how = brain_mask(inp, lambda: _contrasts(x, p.sequence))
    brain_ml = float(brain.sum()) * inp.voxel_ml
    margin = int(np.ceil(p.margin_mm / inp.spacing.min())) if p.margin_mm > 0 else 0
    if x.path().name.endswith((".nii", ".nii.gz")):
        seg = x.nifti()
        tum = np.asarray(seg.data) != 0
        if tum.ndim != 3 or not tum.any():
            raise Unavailable("tumour mask is empty or not 3-D")
        inside = float(inside_mask(brain, inp.affine, grid_points(seg, tum), margin).mean())
        tumour_ml = float(tum.sum()) * seg.voxel_ml
        what = f"{100 * inside:.1f} % of {int(tum.sum())} tumour voxels"
    else:
        table = x.json()
        rows = [r for r in table.get("rows", []) if isinstance(r, dict)]
        foci = ((table.get("meta") or {}).get("whole") or {}).get("foci") or []  # every focus must be in the brain too
        cents = [[r.get(f"centroid_{a}") for a in "xyz"] for r in rows + [f for f in foci if isinstance(f, dict)]]
        cents = [c for c in cents if all(isinstance(v, (int, float)) for v in c)]
        if not cents:
            raise Unavailable("features table has no centroid_x/y/z")
        inside = float(inside_mask(brain, inp.affine, np.asarray(cents, np.float64), margin).mean())
        tumour_ml = sum(number(r["volume_ml"], "volume_ml") for r in rows
                        if len(r.get("labels") or [r.get("label")]) == 1 and r.get("volume_ml") is not None)
        what = f"{100 * inside:.0f} % of {len(cents)} ROI centroids"
    share = tumour_ml / brain_ml if brain_ml > 0 else float("inf")
    limit = f"≥ {100 * p.min_inside:g} % inside, ≤ {100 * p.max_brain_fraction:g} % of the brain"
    problems = []
    if inside < p.min_inside:
        problems.append(f"only {what} inside the brain ({how})")
    if share > p.max_brain_fraction:
        problems.append(f"tumour {tumour_ml:.0f} mL is {100 * share:.0f} % of the {brain_ml:.0f} mL brain")
    if problems:
        return Verdict(False, inside, limit, "; ".join(problems))
    return Verdict(True, inside, limit, f"{what} inside the brain; tumour {100 * share:.1f} % of the brain")


class NestedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tc_labels: list[int] = Field(default_factory=lambda: [1, 4], description="tumour core = these labels")
    min_agreement: float = Field(0.99, ge=0, le=1)


@check("compartments_nested", NestedParams)
def compartments_nested(x: Inputs, p: NestedParams) -> Verdict:
    """The delivered whole-tumour mask is the union of the label map's compartments and
    contains the tumour core (TC ⊆ WT; ET ⊆ TC holds inside one BraTS label map by its
    definition): Dice(WT, labels > 0) and the share of TC inside WT both ≥ 0.99. Value: the
    Dice."""
    wt, lab = x.nifti(), x.nifti("labels")
    w, labels = np.asarray(wt.data) != 0, np.asarray(lab.data)
    if w.shape != labels.shape:
        return Verdict(False, None, "same grid", f"WT mask {w.shape} and label map {labels.shape} differ in shape")
    d = dice(w, labels != 0)
    tc = np.isin(labels, p.tc_labels)
    tc_in = float((tc & w).sum()) / tc.sum() if tc.any() else 1.0
    limit = f"Dice(WT, labels>0) ≥ {p.min_agreement:g}, TC ⊆ WT"
    ok = d >= p.min_agreement and tc_in >= p.min_agreement
    return Verdict(ok, d, limit, f"Dice(WT, labels>0) {d:.4f}, {100 * tc_in:.1f} % of TC inside WT"
                   + ("" if ok else ": the compartments are not nested"))


def _single_label_rows(features: dict[str, Any]) -> dict[int, float]:
    out: dict[int, float] = {}
    for r in features.get("rows") or []:
        labs = r.get("labels", [r.get("label")]) if isinstance(r, dict) else None
        if isinstance(labs, list) and len(labs) == 1 and labs[0] is not None and r.get("volume_ml") is not None:
            out[int(labs[0])] = number(r["volume_ml"], f"volume_ml of label {labs[0]}")
    if not out:
        raise Unavailable("features table has no per-label rows with volume_ml")
    return out


class VolumeAgreeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rel_tol: float = Field(0.02, gt=0)
    enhancing_label: int = 4


@check("compartment_volumes", VolumeAgreeParams)
def compartment_volumes(x: Inputs, p: VolumeAgreeParams) -> Verdict:
    """The features table's per-compartment volumes are the label map's (voxel count x voxel
    volume, within 2 %) and sum to its whole tumour. Value: the largest relative difference."""
    rows, lab = _single_label_rows(x.json()), x.nifti("labels")
    data = np.asarray(lab.data)
    pairs = {f"label {k}": (v, float(np.count_nonzero(data == k)) * lab.voxel_ml) for k, v in rows.items()}
    pairs["sum (WT)"] = (sum(rows.values()), float(np.count_nonzero(data)) * lab.voxel_ml)
    rel = {k: abs(t - m) / max(m, 1e-6) for k, (t, m) in pairs.items()}
    worst = max(rel, key=rel.get)
    ok = rel[worst] <= p.rel_tol
    t, m = pairs[worst]
    return Verdict(ok, rel[worst], f"≤ {100 * p.rel_tol:g} %",
                   f"{worst}: table {t:.2f} mL vs label map {m:.2f} mL ({100 * rel[worst]:.2f} % apart)")


@check("grade_matches_features", VolumeAgreeParams)
def grade_matches_features(x: Inputs, p: VolumeAgreeParams) -> Verdict:
    """The grade is HGG or LGG and the volumes it cites (``scores.whole_tumour_ml``,
    ``scores.enhancing_ml``) are the features table's (within 2 %). Value: the largest
    relative difference."""
    grade = x.json()
    if grade.get("label") not in ("HGG", "LGG"):
        return Verdict(False, None, "HGG | LGG", f"grade label {grade.get('label')!r} is not HGG or LGG")
    scores = grade.get("scores") or {}
    if scores.get("whole_tumour_ml") is None:
        return Verdict(None, None, "", "not applicable: the grade cites no volumes")
    rows = _single_label_rows(x.json("features"))
    pairs = {"whole_tumour_ml": (number(scores["whole_tumour_ml"], "whole_tumour_ml"), sum(rows.values()))}
    if scores.get("enhancing_ml") is not None:
        pairs["enhancing_ml"] = (number(scores["enhancing_ml"], "enhancing_ml"), rows.get(p.enhancing_label, 0.0))
    rel = {k: abs(t - m) / max(m, 1e-6) for k, (t, m) in pairs.items()}
    worst = max(rel, key=rel.get)
    ok = rel[worst] <= p.rel_tol
    t, m = pairs[worst]
    return Verdict(ok, rel[worst], f"≤ {100 * p.rel_tol:g} %",
                   f"{grade['label']}; {worst} {t:.2f} mL vs features {m:.2f} mL")


__all__ = ["brain_mask", "brats_labels", "inside_mask", "compartment_volumes", "compartments_nested", "grade_matches_features",
           "tumour_in_brain"]
