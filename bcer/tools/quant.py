"""Quantification: ROI statistics and features, and cardiac function from label cines.

Every length is in world millimetres (through the affine, so oblique and anisotropic grids
measure correctly), every volume in mL (voxel count x voxel volume), centroids in RAS+ mm.
Tables put one ROI per row (``quant.roi_*``) or one case per row (``quant.cardiac_function``)
with the unit of every numeric column in ``Table.units``.
"""
from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy.spatial import ConvexHull, QhullError
from scipy.spatial.distance import pdist

from ..contracts.artifacts import Image, Mask, Table
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import vox2world
from ._checks import require_ndim, require_nonempty, require_same_grid, require_volume
from .cardiac import LV, MYO, RV, label_cine, max_wall_thickness_mm, regional_thickening, volume_curves
from .laterality import Midline, components, midline_from_image, midline_from_mask, right_share, side_word
from .registry import tool

log = logging.getLogger(__name__)

MYO_DENSITY_G_ML = 1.05


class RoiStatsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[int] | None = Field(None, description="label values to measure; None: every non-zero label present")


class RoiFeaturesParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[int] | None = Field(None, description="label values to measure; None: every non-zero label present")
    composites: dict[str, list[int]] = Field(
        default_factory=dict, description="extra ROIs made of several labels, e.g. BraTS "
                                          "{'WT': [1, 2, 4], 'TC': [1, 4], 'ET': [4]}")
    side_reference: Literal["image", "mask", "none"] = Field(
        "image", description="midline that decides the side: 'image' the mid-sagittal plane fitted to the image's "
                             "foreground (head/brain/body), 'mask' a sagittal plane through the centroid of all the "
                             "mask's labels (an organ that straddles the midline, e.g. prostate zones), 'none' no side")
    bilateral_share: float = Field(0.1, gt=0.0, lt=0.5, description="a region with at least this share of its voxels "
                                                                   "on each side of the midline is 'bilateral'")
    min_focus_ml: float = Field(0.5, ge=0.0, le=100.0, description="a connected component of a region counts as a "
                                                                    "focus of its own from this volume (mL) up")


class CardiacFunctionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    height_cm: float | None = Field(None, ge=40.0, le=250.0, description="body height (cm), bound to @case.height")
    weight_kg: float | None = Field(None, ge=2.0, le=400.0, description="body weight (kg), bound to @case.weight")
    n_sectors: int = Field(6, ge=4, le=12, description="circumferential sectors per slice for regional thickening")
    akinesia_thickening_pct: float = Field(
        10.0, ge=0.0, le=50.0, description="a segment thickening less than this (%) in systole is akinetic")
    thinning_ratio: float = Field(
        0.75, gt=0.0, le=1.0, description="an akinetic segment also thinner than this x the median ED wall "
                                          "counts as abnormal (scar), not just hypokinetic")


def _intensity_unit(image: Image) -> str:
    return str(image.meta.get("units", "a.u."))


def _roi_masks(mask: np.ndarray, names: dict[int, str], labels: list[int] | None,
               composites: dict[str, list[int]]) -> list[tuple[str, list[int], np.ndarray]]:
    present = [int(v) for v in np.unique(mask) if v != 0]
    wanted = present if labels is None else [int(v) for v in labels]
    rois = [(names.get(v, f"label_{v}"), [v], mask == v) for v in wanted]
    rois += [(name, [int(v) for v in vals], np.isin(mask, vals)) for name, vals in composites.items()]
    empty = [name for name, _, m in rois if not m.any()]
    if not rois or (labels is not None and empty):
        raise ToolError(ErrorCode.value_range, f"mask has no voxels for ROI(s) {empty or 'any'}; labels "
                        f"present: {present}", arg="mask")
    return rois


def _inputs(image: Image, mask: Mask) -> tuple[np.ndarray, np.ndarray]:
    data = require_volume(image, "image")
    require_ndim(mask, 3, "mask")
    require_same_grid(image, mask, "image", "mask")
    require_nonempty(mask, "mask")
    return data, np.asarray(mask.data)


def max_diameter_mm(ijk: np.ndarray, affine: np.ndarray) -> float:
    """Largest distance (mm) between two voxel centres of a region given as voxel indices (N, 3).

    The farthest pair lies on the convex hull, so only hull vertices are compared.
    """
    pts = vox2world(affine, ijk)
    if len(pts) < 2:
        return 0.0
    try:
        pts = pts[ConvexHull(pts).vertices]
    except (QhullError, ValueError):  # flat or tiny sets: compare every point (few of them)
        if len(pts) > 4000:
            pts = pts[np.unique(np.concatenate([pts.argmin(0), pts.argmax(0)]))]
    return float(pdist(pts).max())


@tool("quant.roi_stats", version="1.0", milestone="quantification", resources={"num_cpus": 1, "memory_mb": 512},
      output="table")
def roi_stats(image: Image, mask: Mask, params: RoiStatsParams) -> Table:
    """Per-label volume (mL) and intensity mean/std/min/max of an image inside a label mask.

    Returns:
        Table with one row per label: ``roi``, ``label``, ``voxels``, ``volume_ml``, ``mean``,
        ``std``, ``min``, ``max``.

    Raises:
        ToolError: ``shape`` (not 3-D, off-grid), ``numeric`` (NaN/Inf), ``value_range``
            (empty mask or a requested label absent).
    """
    data, lab = _inputs(image, mask)
    vox = mask.voxel_volume_ml
    rows = []
    for name, vals, m in _roi_masks(lab, mask.labels, params.labels, {}):
        v = data[m].astype(np.float64)
        rows.append({"roi": name, "label": vals[0], "voxels": int(m.sum()), "volume_ml": float(m.sum() * vox),
                     "mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()), "max": float(v.max())})
    u = _intensity_unit(image)
    return Table(rows, {"volume_ml": "mL", "voxels": "voxels", "mean": u, "std": u, "min": u, "max": u},
                 name="roi_stats", meta={"method": "label counts x voxel volume", "voxel_ml": vox})


def _midline(image: Image, mask: Mask, how: str) -> Midline | None:
    if how == "image":
        return midline_from_image(np.asarray(image.data), image.affine)
    return midline_from_mask(np.asarray(mask.data), mask.affine) if how == "mask" else None


def _laterality(ijk: np.ndarray, affine: np.ndarray, midline: Midline | None, share: float) -> dict[str, Any]:
    """Side ("R", "L", "bilateral"; "" without a midline), the share of voxels on each side (%)
    and the centroid's signed distance from the midline (mm, > 0 right)."""
    if midline is None:
        return {"side": "", "right_share_pct": None, "left_share_pct": None, "midline_offset_mm": None}
    r = right_share(ijk, affine, midline)
    offset = float(midline.signed_mm(vox2world(affine, ijk.mean(axis=0)))[0])
    return {"side": side_word(r, share), "right_share_pct": 100.0 * r, "left_share_pct": 100.0 * (1.0 - r),
            "midline_offset_mm": offset}


def _foci(m: np.ndarray, affine: np.ndarray, vox_ml: float, midline: Midline | None,
          p: RoiFeaturesParams) -> list[dict[str, Any]]:
    """Every connected component of at least ``min_focus_ml`` (the largest one when none is
    that big), largest first, each with its own volume, diameter, centroid and side."""
    parts = components(m, max(1, int(np.ceil(p.min_focus_ml / vox_ml))))
    if not parts:
        parts = components(m, 1)[:1]
    out = []
    for k, ijk in enumerate(parts, start=1):
        c = vox2world(affine, ijk.mean(axis=0))
        out.append({"focus": k, "volume_ml": float(len(ijk) * vox_ml), "max_diameter_mm": max_diameter_mm(ijk, affine),
                    "centroid_x": float(c[0]), "centroid_y": float(c[1]), "centroid_z": float(c[2]),
                    **_laterality(ijk, affine, midline, p.bilateral_share)})
    return out


@tool("quant.roi_features", version="1.1", milestone="quantification",
      resources={"num_cpus": 1, "memory_mb": 1024}, output="features")
def roi_features(image: Image, mask: Mask, params: RoiFeaturesParams) -> Table:
    """Per-ROI features: volume, intensity distribution, largest 3-D diameter, centroid, side
    in the patient's frame, and the ROI's foci.

    The side is decided against the patient's midline (:mod:`bcer.tools.laterality`), never by
    the sign of a world coordinate: by default the mid-sagittal plane fitted to the
    foreground of ``image`` (the head or brain of a brain scan, the body of a pelvis; a field of
    view that cuts the body gives no midline and an empty side); ``side_reference="mask"``
    puts it through the centroid of all the mask's labels (sides relative to an organ such as
    the prostate gland, when the mask holds the whole gland). A side is ``"bilateral"`` when
    each side holds at least ``bilateral_share`` of the ROI. For a cardiac cine the side
    relative to the body's midline says little (the heart is left of it); read it as such.

    Args:
        image: intensities to summarise (on the mask's grid); its foreground gives the midline.
        mask: integer labels; ``mask.labels`` names the rows.
        params: which labels, composite ROIs built from several labels, the midline source,
            the bilateral share and the smallest focus.

    Returns:
        Table, one row per ROI: ``roi``, ``labels``, ``volume_ml``, ``mean``, ``median``, ``std``,
        ``p10``, ``p90``, ``max_diameter_mm`` (largest distance between voxel centres, world mm),
        ``centroid_x/y/z`` (RAS mm), ``side`` ("R", "L", "bilateral", "" without a midline),
        ``right_share_pct``/``left_share_pct`` and ``midline_offset_mm`` (centroid, > 0 right),
        ``n_foci``, ``multifocal`` (two or more foci) and ``foci`` (each focus of at least
        ``min_focus_ml``, 26-connected, largest first: its volume, diameter, centroid and side;
        where no component is that large, the largest one). ``meta["whole"]``: the same
        laterality and foci for the union of every ROI measured (the whole tumour of a
        per-compartment BraTS table).

    Raises:
        ToolError: ``shape``, ``numeric``, ``value_range`` as ``quant.roi_stats``.
    """
    data, lab = _inputs(image, mask)
    vox = mask.voxel_volume_ml
    midline = _midline(image, mask, params.side_reference)
    rows, labels = [], set()
    for name, vals, m in _roi_masks(lab, mask.labels, params.labels, params.composites):
        if not m.any():
            continue
        labels.update(vals)
        ijk = np.argwhere(m)
        v = data[m].astype(np.float64)
        centroid = vox2world(mask.affine, ijk.mean(axis=0))
        p10, med, p90 = np.percentile(v, [10, 50, 90])
        foci = _foci(m, mask.affine, vox, midline, params)
        rows.append({"roi": name, "labels": vals, "volume_ml": float(len(ijk) * vox), "mean": float(v.mean()),
                     "median": float(med), "std": float(v.std()), "p10": float(p10), "p90": float(p90),
                     "max_diameter_mm": max_diameter_mm(ijk, mask.affine),
                     "centroid_x": float(centroid[0]), "centroid_y": float(centroid[1]),
                     "centroid_z": float(centroid[2]),
                     **_laterality(ijk, mask.affine, midline, params.bilateral_share),
                     "n_foci": len(foci), "multifocal": len(foci) >= 2, "foci": foci})
    u = _intensity_unit(image)
    units = {"volume_ml": "mL", "max_diameter_mm": "mm", "centroid_x": "mm", "centroid_y": "mm",
             "centroid_z": "mm", "right_share_pct": "%", "left_share_pct": "%", "midline_offset_mm": "mm",
             "n_foci": "foci", **{k: u for k in ("mean", "median", "std", "p10", "p90")}}
    return Table(rows, units, name="roi_features",
                 meta={"method": "voxel counts; convex-hull diameter in world mm; RAS centroid; side against the "
                                 "patient's midline; 26-connected foci",
                       "image_sequence": image.meta.get("sequence", ""),
                       "midline": midline.as_dict() if midline else None,
                       "side_reference": params.side_reference, "bilateral_share": params.bilateral_share,
                       "min_focus_ml": params.min_focus_ml,
                       "whole": _whole(np.isin(lab, sorted(labels)), mask.affine, vox, midline, params)})


def _whole(m: np.ndarray, affine: np.ndarray, vox_ml: float, midline: Midline | None,
           p: RoiFeaturesParams) -> dict[str, Any]:
    """The lesion as a whole (the union of every ROI measured, e.g. a tumour's compartments):
    its side, shares, foci and the multifocal flag, which per-compartment rows cannot give."""
    foci = _foci(m, affine, vox_ml, midline, p)
    return {"volume_ml": float(np.count_nonzero(m) * vox_ml),
            **_laterality(np.argwhere(m), affine, midline, p.bilateral_share),
            "n_foci": len(foci), "multifocal": len(foci) >= 2, "foci": foci}


def _frames(phases: Table | None, lv_curve: np.ndarray) -> tuple[int, int, str]:
    if phases is None:
        return int(np.argmax(lv_curve)), int(np.argmin(lv_curve)), "lv_volume_curve"
    if not phases.rows or "ed_frame" not in phases.rows[0] or "es_frame" not in phases.rows[0]:
        raise ToolError(ErrorCode.schema, "phases table needs ed_frame and es_frame (cardiac.ed_es output)",
                        arg="phases")
    ed, es = int(phases.rows[0]["ed_frame"]), int(phases.rows[0]["es_frame"])
    for arg, f in (("ed_frame", ed), ("es_frame", es)):
        if not 0 <= f < len(lv_curve):
            raise ToolError(ErrorCode.value_range, f"phases {arg}={f} outside the {len(lv_curve)} frames",
                            arg="phases")
    return ed, es, "phases"


def ejection_fraction(edv: float, esv: float) -> float:
    """EF in % from end-diastolic and end-systolic volumes (0 without an EDV)."""
    return 100.0 * (edv - esv) / edv if edv > 0 else 0.0


def _is_frame(v: Any, n: int) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= int(v) < n


def phase_sensitivity(curves: dict[str, np.ndarray], ed: int, es: int, phases: Table | None) -> dict[str, Any]:
    """How far the ejection fractions rest on cardiac.ed_es's choice of frames.

    Always ``ed_es_confidence`` and ``ed_es_ambiguous`` when ``phases`` has them. Where the pick
    is flagged as within the curve's noise, the runner-up frame of each phase the table says is
    in doubt (``ed_alternative``/``es_alternative``; :func:`.cardiac.phase_margins` decides) and
    the least and largest LV/RV EF over the chosen and alternative frames. Nothing for metadata
    frames (they are not the curve's choice) or a phases table without margins (no cine)."""
    row = phases.rows[0] if phases is not None and phases.rows else {}
    if row.get("source") == "metadata" or not isinstance(row.get("ed_es_ambiguous"), bool):
        return {}
    out: dict[str, Any] = {"ed_es_confidence": row.get("ed_es_confidence"), "ed_es_ambiguous": row["ed_es_ambiguous"]}
    if not row["ed_es_ambiguous"]:
        return out
    n = len(curves["lv"])
    frames = {"ed": [ed], "es": [es]}
    for ph in ("ed", "es"):
        alt = row.get(f"{ph}_runner_up")
        if row.get(f"{ph}_in_doubt") is True and _is_frame(alt, n):  # another tool's table may lack both
            out[f"{ph}_alternative"] = int(alt)
            frames[ph].append(int(alt))
    for side in ("lv", "rv"):
        c = curves[side]
        efs = [ejection_fraction(float(c[a]), float(c[b])) for a in frames["ed"] for b in frames["es"]]
        out[f"{side}_ef_min_pct"], out[f"{side}_ef_max_pct"] = min(efs), max(efs)
    return out


def robust_segment_wall_mm(rows: list[dict[str, Any]]) -> float:
    """Thickest sector wall (mm) that at least two slices reach.

    Per sector, the second-largest ED segment wall over slices (the only one when a sector
    has a single slice); the largest of these over sectors. Hypertrophy spans several
    slices of a sector, while a coarse segmentation's one-slice excursion (a partial-volume
    apical slice, a leak into the pericardial tissue) does not: at ~3 mm in-plane voxels such
    an excursion adds 3-5 mm to one segment of a normal wall.
    """
    by_sector: dict[int, list[float]] = {}
    for r in rows:
        by_sector.setdefault(int(r["sector"]), []).append(float(r["wall_ed_mm"]))
    if not by_sector:
        return float("nan")
    return max(sorted(v)[-2] if len(v) >= 2 else v[0] for v in by_sector.values())


def _regional(ed_lab: np.ndarray, es_lab: np.ndarray, affine: np.ndarray,
              p: CardiacFunctionParams) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows = regional_thickening(ed_lab, es_lab, affine, p.n_sectors)
    if not rows:
        return {"n_segments": 0, "n_abnormal_segments": 0, "median_segment_thickening_pct": float("nan"),
                "min_segment_thickening_pct": float("nan"), "max_segment_wall_mm": float("nan"),
                "robust_segment_wall_mm": float("nan")}, rows
    wall = np.array([r["wall_ed_mm"] for r in rows])
    thick = np.array([r["thickening_pct"] for r in rows])
    abnormal = (thick < p.akinesia_thickening_pct) & (wall < p.thinning_ratio * np.median(wall))
    for r, a in zip(rows, abnormal):
        r["abnormal"] = bool(a)
    return {"n_segments": len(rows), "n_abnormal_segments": int(abnormal.sum()),
            "median_segment_thickening_pct": float(np.median(thick)),
            "min_segment_thickening_pct": float(thick.min()), "max_segment_wall_mm": float(wall.max()),
            "robust_segment_wall_mm": robust_segment_wall_mm(rows)}, rows


_FUNCTION_UNITS = {
    "lv_edv_ml": "mL", "lv_esv_ml": "mL", "lv_sv_ml": "mL", "lv_ef_pct": "%", "rv_edv_ml": "mL", "rv_esv_ml": "mL",
    "rv_sv_ml": "mL", "rv_ef_pct": "%", "myo_volume_ml": "mL", "myo_mass_g": "g", "max_wall_thickness_mm": "mm",
    "bsa_m2": "m2", "lv_edvi_ml_m2": "mL/m2", "lv_esvi_ml_m2": "mL/m2", "rv_edvi_ml_m2": "mL/m2",
    "rv_esvi_ml_m2": "mL/m2", "lv_mass_index_g_m2": "g/m2", "median_segment_thickening_pct": "%",
    "min_segment_thickening_pct": "%", "max_segment_wall_mm": "mm", "robust_segment_wall_mm": "mm", "n_abnormal_segments": "segments", "n_segments": "segments",
    "ed_frame": "frame", "es_frame": "frame", "height_cm": "cm", "weight_kg": "kg",
    "ed_alternative": "frame", "es_alternative": "frame", "lv_ef_min_pct": "%", "lv_ef_max_pct": "%",
    "rv_ef_min_pct": "%", "rv_ef_max_pct": "%"}


@tool("quant.cardiac_function", version="1.3", milestone="quantification",
      resources={"num_cpus": 1, "memory_mb": 1024}, output="function")
def cardiac_function(labels: Mask, params: CardiacFunctionParams, phases: Table | None = None) -> Table:
    """LV/RV volumes and ejection fractions, myocardial mass, wall thickness, BSA-indexed values
    and regional wall thickening from a short-axis label cine.

    Volumes are label counts x voxel volume at ED/ES (from ``phases``, else the LV curve's
    max/min); mass = myocardial volume at ED x 1.05 g/mL; maximal wall thickness at ED by the
    in-plane distance transform to the cavity (mm), and the thickest segment (mean ray-cast
    thickness per slice and sector, ``max_segment_wall_mm``: the ACDC "segment thickness", robust
    to a stray voxel of a segmentation), and the thickest sector wall that two slices reach
    (``robust_segment_wall_mm``, see :func:`robust_segment_wall_mm`: robust to a one-slice
    excursion of a coarse segmentation); BSA by Mosteller from ``height_cm`` and
    ``weight_kg`` (indexed values are left out without them). Regional function: per slice and
    sector, ray-cast wall thickness at ED and ES; a segment is abnormal when it thickens less
    than ``akinesia_thickening_pct`` and is thinner than ``thinning_ratio`` x the median wall
    (the per-segment list is in ``meta["regional"]``). With a phases table from the curve
    (``cardiac.ed_es`` given the cine), its confidence, and where it is ambiguous the EF range
    over the runner-up frames (:func:`phase_sensitivity`).

    Returns:
        One-row Table (see ``Table.units`` for every column's unit).

    Raises:
        ToolError: ``shape`` (not (X,Y,Z,T)), ``value_range`` (no LV, frames out of range),
            ``schema`` (phases table without ed_frame/es_frame).
    """
    data = label_cine(labels)
    vox = labels.voxel_volume_ml
    curves = volume_curves(data, vox)
    ed, es, source = _frames(phases, curves["lv"])
    sx, sy, _ = labels.spacing
    ed_lab, es_lab = data[..., ed], data[..., es]
    row: dict[str, Any] = {"ed_frame": ed, "es_frame": es}
    for side, curve in (("lv", curves["lv"]), ("rv", curves["rv"])):
        edv, esv = float(curve[ed]), float(curve[es])
        row.update({f"{side}_edv_ml": edv, f"{side}_esv_ml": esv, f"{side}_sv_ml": edv - esv,
                    f"{side}_ef_pct": ejection_fraction(edv, esv)})
    row["myo_volume_ml"] = float(curves["myo"][ed])
    row["myo_mass_g"] = row["myo_volume_ml"] * MYO_DENSITY_G_ML
    row["max_wall_thickness_mm"] = max_wall_thickness_mm(ed_lab == LV, ed_lab == MYO, (sx, sy))
    if params.height_cm is not None and params.weight_kg is not None:
        bsa = float(np.sqrt(params.height_cm * params.weight_kg / 3600.0))
        row.update(height_cm=params.height_cm, weight_kg=params.weight_kg, bsa_m2=bsa,
                   lv_edvi_ml_m2=row["lv_edv_ml"] / bsa, lv_esvi_ml_m2=row["lv_esv_ml"] / bsa,
                   rv_edvi_ml_m2=row["rv_edv_ml"] / bsa, rv_esvi_ml_m2=row["rv_esv_ml"] / bsa,
                   lv_mass_index_g_m2=row["myo_mass_g"] / bsa)
    else:
        log.info("quant.cardiac_function: no height/weight, BSA-indexed values left out")
    summary, regional = _regional(ed_lab, es_lab, labels.affine, params)
    row.update(summary)
    row.update(phase_sensitivity(curves, ed, es, phases))
    if row["rv_edv_ml"] == 0:
        log.info("quant.cardiac_function: no RV voxels (label %d) at ED", RV)
    meta = {"method": "label counts x voxel volume; Mosteller BSA; EDT wall thickness; ray-cast regional, world-anchored sectors",
            "frames_from": source, "myo_density_g_ml": MYO_DENSITY_G_ML, "regional": regional}
    units = {k: v for k, v in _FUNCTION_UNITS.items() if k in row}
    return Table([row], units, name="cardiac_function", meta=meta)
