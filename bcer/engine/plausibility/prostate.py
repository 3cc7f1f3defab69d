"""Checks of prostate deliverables: gland volume and position, lesions against the gland,
PI-RADS against the lesion list."""
from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import ndimage

from ...metrics import box_volume
from .core import Inputs, NoParams, Unavailable, Verdict, Volume, check, in_range, number, pirads_category, world_to_voxel


class GlandVolumeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_ml: float = Field(10.0, ge=0)
    max_ml: float = Field(250.0, gt=0)


@check("gland_volume", GlandVolumeParams)
def gland_volume(x: Inputs, p: GlandVolumeParams) -> Verdict:
    """Gland volume (non-zero voxels x voxel volume) within 10–250 mL: an adult gland is
    ~20–30 mL and benign hyperplasia reaches 100–200+ mL; below 10 mL or above 250 mL a
    mask is missing most of the gland or has leaked into the pelvis (limits of issue 10;
    PI-RADS v2.1 measures gland volume for PSA density on this scale)."""
    vol = x.nifti()
    ml = float(np.count_nonzero(vol.data)) * vol.voxel_ml
    return in_range(ml, p.min_ml, p.max_ml, "gland volume", "mL")


class EdgeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_edge_fraction: float = Field(0.005, ge=0, le=1, description="mask voxels allowed on the in-plane border")


def _inplane_axes(vol: Volume) -> list[int]:
    """The two axes of finest spacing (the slice axis is the coarsest); all three if isotropic."""
    sp = vol.spacing
    if np.ptp(sp) < 1e-3 * sp.max():
        return [0, 1, 2]
    return sorted(int(a) for a in np.argsort(sp)[:2])


@check("organ_off_edge", EdgeParams)
def organ_off_edge(x: Inputs, p: EdgeParams) -> Verdict:
    """The organ mask stays off the in-plane border of its image (at most 0.5 % of its voxels
    on it): a diagnostic exam centres its field of view on the organ with margin, so a mask
    that reaches the edge has leaked into the surroundings (or the organ was cut off)."""
    vol = x.nifti()
    m = np.asarray(vol.data) != 0
    if m.ndim != 3:
        raise Unavailable(f"mask has {m.ndim} dimensions, need 3")
    total = int(m.sum())
    if total == 0:
        raise Unavailable("mask is empty")
    edge = np.zeros_like(m)
    for ax in _inplane_axes(vol):
        sl = [slice(None)] * 3
        for end in (0, -1):
            sl[ax] = end
            edge[tuple(sl)] = True
    frac = float((m & edge).sum()) / total
    ok = frac <= p.max_edge_fraction
    return Verdict(ok, frac, f"≤ {100 * p.max_edge_fraction:g} % of voxels on the in-plane border",
                   f"{100 * frac:.2f} % of the mask on the in-plane image border"
                   + ("" if ok else ": it reaches the edge of the field of view"))


def _gland_and_items(x: Inputs) -> tuple[Volume, np.ndarray, list[dict[str, Any]], dict[str, Any]]:
    findings = x.json()
    items = findings.get("items")
    if not isinstance(items, list):
        raise Unavailable("findings have no 'items' list")
    gland = x.nifti("gland")
    return gland, np.asarray(gland.data) != 0, items, findings


def _box_on_gland(item: dict[str, Any], findings: dict[str, Any], gland: Volume) -> np.ndarray:
    """The lesion box as [[lo], [hi]] voxel indices of the gland grid (min inclusive, max exclusive)."""
    box = np.asarray(item.get("box_voxel"), dtype=np.float64)
    aff = np.asarray(findings.get("affine") or np.eye(4), dtype=np.float64)
    if box.shape != (2, 3):
        raise Unavailable(f"lesion {item.get('id')!r} has no [[i,j,k],[i,j,k]] box_voxel")
    if aff.shape == (4, 4) and np.allclose(aff, gland.affine, atol=1e-3):
        return box
    world = np.asarray(item.get("box_world"), dtype=np.float64)  # boxes on another grid: map the corners
    if world.shape != (2, 3):
        raise Unavailable(f"lesion {item.get('id')!r} is on another grid and has no box_world")
    corners = np.array([[world[i, 0], world[j, 1], world[k, 2]] for i in (0, 1) for j in (0, 1) for k in (0, 1)])
    ijk = world_to_voxel(gland.affine, corners)
    return np.stack([np.floor(ijk.min(0) + 0.5), np.floor(ijk.max(0) + 0.5) + 1])


class LesionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_box_fraction: float = Field(0.2, ge=0, le=1, description="share of a lesion's box inside the gland")
    margin_mm: float = Field(3.0, ge=0, description="the box centre may lie this far outside the gland mask")


@check("lesions_in_gland", LesionParams)
def lesions_in_gland(x: Inputs, p: LesionParams) -> Verdict:
    """Every lesion box lies inside the image, its centre inside the gland (3 mm tolerance
    for a lesion at the capsule) and at least 20 % of the box inside the gland mask. A
    prostate lesion is by definition in the gland; a box around an irregular peripheral
    lesion keeps well above 20 % of its voxels in the gland. Value: the lowest share."""
    gland, m, items, findings = _gland_and_items(x)
    if not items:
        return Verdict(True, None, f"≥ {100 * p.min_box_fraction:g} % of each box in the gland", "no lesions")
    near = ndimage.binary_dilation(m, iterations=max(1, int(np.ceil(p.margin_mm / gland.spacing.min()))))
    shape = np.asarray(m.shape)
    worst, problems = 1.0, []
    for it in items:
        box = _box_on_gland(it, findings, gland)
        lo, hi = box[0].astype(int), box[1].astype(int)
        name = it.get("id", "?")
        if np.any(lo < 0) or np.any(hi > shape) or np.any(hi <= lo):
            problems.append(f"{name} box {lo.tolist()}–{hi.tolist()} is outside the image {shape.tolist()}")
            worst = 0.0
            continue
        inside = float(m[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]].sum()) / box_volume(box)
        centre = np.clip(((lo + hi - 1) / 2).round().astype(int), 0, shape - 1)
        worst = min(worst, inside)
        if not near[tuple(centre)]:
            problems.append(f"{name} centre {centre.tolist()} is outside the gland")
            worst = min(worst, 0.0)
        elif inside < p.min_box_fraction:
            problems.append(f"only {100 * inside:.0f} % of {name}'s box is in the gland")
    limit = f"≥ {100 * p.min_box_fraction:g} % of each box in the gland"
    if problems:
        return Verdict(False, worst, limit, "; ".join(problems))
    return Verdict(True, worst, limit, f"{len(items)} lesion(s) inside the gland (lowest share {100 * worst:.0f} %)")


@check("lesions_smaller_than_gland", NoParams)
def lesions_smaller_than_gland(x: Inputs, p: NoParams) -> Verdict:
    """Each lesion is smaller than the gland that contains it: volume below the gland's and
    largest diameter below the gland's bounding-box diagonal. Value: the largest ratio of
    lesion to gland volume."""
    gland, m, items, _ = _gland_and_items(x)
    if not items:
        return Verdict(True, None, "< 1 × gland", "no lesions")
    gland_ml = float(m.sum()) * gland.voxel_ml
    if gland_ml <= 0:
        raise Unavailable("gland mask is empty")
    ijk = np.argwhere(m)
    ext = (ijk.max(0) - ijk.min(0) + 1) * gland.spacing
    diag = float(np.linalg.norm(ext))
    worst, problems = 0.0, []
    for it in items:
        name = it.get("id", "?")
        ml = number(it.get("volume_ml"), f"{name}.volume_ml")
        worst = max(worst, ml / gland_ml)
        if ml >= gland_ml:
            problems.append(f"{name} is {ml:.1f} mL in a {gland_ml:.1f} mL gland")
        size = (it.get("attributes") or {}).get("size_mm")
        if size is not None and number(size, f"{name}.size_mm") > diag:
            problems.append(f"{name} spans {size:.0f} mm, more than the gland's {diag:.0f} mm")
    if problems:
        return Verdict(False, worst, "< 1 × gland", "; ".join(problems))
    return Verdict(True, worst, "< 1 × gland", f"largest lesion {100 * worst:.1f} % of the gland volume")


class PiradsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size_5_mm: float = Field(15.0, gt=0, description="PI-RADS 5 needs a lesion at least this large (or extraprostatic extension)")


def _lesion_categories(cls: dict[str, Any]) -> dict[str, int]:
    per = (cls.get("meta") or {}).get("lesions")
    if isinstance(per, list) and all(isinstance(r, dict) and "id" in r for r in per):
        return {str(r["id"]): int(r.get("category", 0)) for r in per}
    return {str(k): int(v) for k, v in (cls.get("scores") or {}).items()}


@check("pirads_consistent", PiradsParams)
def pirads_consistent(x: Inputs, p: PiradsParams) -> Verdict:
    """The PI-RADS category agrees with the lesion list (PI-RADS v2.1, ACR 2019): a category
    1–5; with no lesion at most 2; with lesions scored per lesion, the case category is the
    highest lesion category and every scored lesion is a reported one; category 5 needs a
    lesion of at least 15 mm or extraprostatic extension/invasive behaviour."""
    cls, findings = x.json(), x.json("findings")
    cat = pirads_category(cls.get("label"))
    if cat is None:
        return Verdict(False, None, "PI-RADS 1–5", f"label {cls.get('label')!r} is not a PI-RADS category")
    items = findings.get("items") or []
    ids = {str(it.get("id")) for it in items}
    per = _lesion_categories(cls)
    problems = []
    if not items and cat > 2:
        problems.append(f"PI-RADS {cat} with no lesion reported")
    if per:
        unknown = sorted(set(per) - ids)
        if unknown:
            problems.append(f"scored lesion(s) {unknown} are not in the findings")
        if items and max(per.values()) != cat:
            problems.append(f"case category {cat} but highest lesion category {max(per.values())}")
    if cat == 5:
        big = [it for it in items if float((it.get("attributes") or {}).get("size_mm") or 0) >= p.size_5_mm
               or (it.get("attributes") or {}).get("epe")]
        if not big:
            problems.append(f"PI-RADS 5 without a lesion ≥ {p.size_5_mm:g} mm or extraprostatic extension")
    limit = f"category = highest lesion category; 5 needs ≥ {p.size_5_mm:g} mm"
    if problems:
        return Verdict(False, float(cat), limit, "; ".join(problems))
    return Verdict(True, float(cat), limit, f"PI-RADS {cat} over {len(items)} lesion(s)")


__all__ = ["gland_volume", "lesions_in_gland", "lesions_smaller_than_gland", "organ_off_edge", "pirads_consistent"]
