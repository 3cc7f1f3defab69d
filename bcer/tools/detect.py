"""Prostate lesion detection from diffusion (``detect.prostate_lesions``).

Where detection runs: on the ADC series' own grid. Its voxels hold unmixed tissue values, so
a lesion's ADC is read without the partial-volume blur a resampling onto the finer T2w grid
would add (that blur pushes small lesions' ADC across the PI-RADS 850 threshold). The gland
and zone masks live on the T2w grid; they are carried onto the ADC grid by nearest neighbour
through ``transform`` (ITK direction, fixed=T2w -> moving=ADC, as ``register.rigid`` returns),
and each lesion found is carried back to the T2w grid by linear interpolation of its
indicator (the 0.5 iso-surface), where its boxes, size, zone, side and T2w ratio are measured.

Ports chain either way a planner builds them:
``register.rigid(fixed=t2w, moving=adc) -> detect(adc=@seq.ADC, dwi=@seq.DWI, transform=...)``
(preferred), or ``register.apply`` of ADC and DWI onto the T2w grid first and no transform.
Without a transform the series are taken as aligned in world space (their affines).

Rule: a voxel is a candidate when it lies in the gland, its ADC is below the lowest normal
zone level by a noise-scaled margin (restricted diffusion), and its high-b DWI is above
``dwi_ratio`` x the lowest zone median (excludes fat/bone that a mask edge may touch);
connected components of at least ``min_volume_ml`` are lesions. A zone's normal level is its
median, or the median of its upper ADC class when a lesion fills much of it (``_normal_level``);
a component holding two lesions of clearly different ADC is split (``_split_levels``). Every
size is in mL/mm, so the rule is the same on the small and full grids.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import ndimage
from skimage.filters import threshold_otsu

from ..contracts.artifacts import Finding, Findings, Image, Mask, Transform
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import same_grid, vox2world
from ._checks import require_ndim, require_nonempty, require_same_grid, require_volume
from ._sitk import ras_to_transform
from .quant import max_diameter_mm
from .registry import tool
from .resample import resample_onto

log = logging.getLogger(__name__)

ZONE_NAMES = {1: "PZ", 2: "TZ"}


class LesionParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    adc_margin_sd: float = Field(4.0, ge=1.0, le=20.0,
                                 description="ADC must fall this many noise SDs below the lowest zone median")
    adc_margin_min: float = Field(40.0, ge=0.0, le=1000.0,
                                  description="and at least this much (ADC units) below it")
    dwi_ratio: float = Field(1.2, ge=0.5, le=5.0,
                             description="DWI must exceed this x the lowest zone median DWI")
    grow_margin_sd: float = Field(2.0, ge=0.0, le=20.0,
                                  description="a lesion grows from its candidate voxels into connected gland voxels "
                                              "this many noise SDs (and adc_margin_min) below the reference "
                                              "(hysteresis; 0 = no growth)")
    min_volume_ml: float = Field(0.05, ge=0.0, le=50.0, description="smallest lesion kept (mL)")
    max_lesions: int = Field(5, ge=1, le=50, description="keep at most this many (largest volume first)")


def _carry(data: np.ndarray, src_aff: np.ndarray, dst_aff: np.ndarray, dst_shape: tuple[int, ...],
           matrix: np.ndarray, interp: str) -> np.ndarray:
    """Sample ``data`` at the destination voxel centres; ``matrix`` maps destination world
    points to source world points."""
    if np.allclose(matrix, np.eye(4), atol=1e-12) and same_grid(src_aff, data.shape, dst_aff, dst_shape, 1e-6):
        return np.asarray(data, dtype=np.float32)
    return resample_onto(np.asarray(data, dtype=np.float32), src_aff, dst_aff, dst_shape[:3], interp,
                         transform=ras_to_transform(matrix), default=0.0)


def _check(adc: Image, dwi: Image, gland: Mask, zones: Mask | None, t2w: Image | None,
           transform: Transform | None) -> np.ndarray:
    require_volume(adc, "adc")
    require_volume(dwi, "dwi")
    require_same_grid(adc, dwi, "adc", "dwi")
    require_ndim(gland, 3, "gland")
    require_nonempty(gland, "gland")
    if zones is not None:
        require_ndim(zones, 3, "zones")
        require_same_grid(gland, zones, "gland", "zones")
    if t2w is not None:
        require_volume(t2w, "t2w")
        require_same_grid(gland, t2w, "gland", "t2w")
    if transform is None:
        return np.eye(4)
    m = np.asarray(transform.matrix, dtype=np.float64)
    if m.shape != (4, 4) or not np.all(np.isfinite(m)) or abs(np.linalg.det(m[:3, :3])) < 1e-9:
        raise ToolError(ErrorCode.value_range, "transform matrix must be a finite, invertible 4x4", arg="transform")
    return m


def _robust(v: np.ndarray) -> tuple[float, float]:
    med = float(np.median(v))
    return med, float(1.4826 * np.median(np.abs(v - med)))


def _normal_level(v: np.ndarray, sd: float, below: float | None = None) -> float:
    """Median ADC of a zone's normal tissue, robust to lesions filling much of the zone.

    Lesions only lower the ADC, so when a zone's values split (Otsu) into two classes more
    than 4 noise SDs apart (pure noise splits about 1.6 SDs apart), its normal tissue is the
    upper class; a zone mask that swallowed a large lesion (or a lesion that fills most of the
    TZ) otherwise drags the median down to the lesion's own ADC and the lesion is never a
    candidate. ``below`` drops voxels of a brighter zone (PZ leaking into the TZ mask) that
    would pose as the upper class, unless that would drop most of the zone: then the zone's
    own tissue is as bright as the cut (a TZ whose ADC is close to the PZ's).
    """
    if below is not None and np.count_nonzero(v < below) >= max(20, v.size // 2):
        v = v[v < below]
    med = float(np.median(v))
    if v.size < 40 or float(v.max() - v.min()) <= 0.0:
        return med
    t = threshold_otsu(v)
    lo, hi = v[v <= t], v[v > t]
    # a few voxels of normal tissue may be all a lesion leaves of a small TZ on the coarse grid
    if hi.size >= max(10, v.size // 10) and lo.size and float(np.median(hi) - np.median(lo)) > 4.0 * sd:
        return float(np.median(hi))
    return med


def _candidates(a: np.ndarray, d: np.ndarray, gl: np.ndarray, zo: np.ndarray,
                p: LesionParams) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(core, loose, info): candidate voxels (restricted diffusion at the strict threshold,
    closed) and the voxels below the looser threshold a lesion may grow into."""
    sels = {}
    for z in (1, 2):
        sel = gl & (zo == z)
        # zone interiors only: borders mix tissues (mask/registration error, interpolation)
        # and would inflate the noise estimate
        inner = ndimage.binary_erosion(sel)
        sel = inner if np.count_nonzero(inner) >= 20 else sel
        if np.count_nonzero(sel) >= 20:
            sels[ZONE_NAMES[z]] = sel
    stats: dict[str, tuple[float, float, float]] = {}
    if sels:
        sd = min(_robust(a[sel])[1] for sel in sels.values())
        # PZ first: the brightest zone; its normal level bounds what the TZ's normal tissue can be
        pz = _normal_level(a[sels["PZ"]], sd) if "PZ" in sels else None
        for name, sel in sels.items():
            below = None if name == "PZ" or pz is None else pz - 3.0 * sd
            level = pz if name == "PZ" else _normal_level(a[sel], sd, below)
            stats[name] = (float(level), sd, float(np.median(d[sel])))
    else:  # no zone masks: the whole gland is the reference
        stats["gland"] = (*_robust(a[gl]), float(np.median(d[gl])))
    ref_adc = min(s[0] for s in stats.values())
    sd = min(s[1] for s in stats.values())
    adc_thr = ref_adc - max(p.adc_margin_sd * sd, p.adc_margin_min)
    dwi_thr = p.dwi_ratio * min(s[2] for s in stats.values())
    strict = gl & (a < adc_thr) & (d > dwi_thr)
    # noise holes inside a lesion must not split it into pieces
    core = ndimage.binary_closing(strict, iterations=1) & gl
    grow_thr = max(adc_thr, ref_adc - max(p.grow_margin_sd * sd, p.adc_margin_min)) if p.grow_margin_sd > 0 else adc_thr
    loose = gl & (a < grow_thr) & (d > dwi_thr)
    info = {"zone_adc_median": {k: s[0] for k, s in stats.items()}, "adc_noise_sd": sd,
            "adc_threshold": adc_thr, "adc_grow_threshold": grow_thr, "dwi_threshold": dwi_thr}
    return core, loose, info


def _split_levels(comps: np.ndarray, n: int, a: np.ndarray, thr: float, sd: float,
                  min_vox: int) -> tuple[np.ndarray, int]:
    """Split components holding two lesions of clearly different ADC.

    Two lesions a voxel or two apart on the coarse diffusion grid touch (26-connectivity, the
    hole-closing step); one box over both fails either lesion. When a component's restricted
    voxels fall into two ADC classes (Otsu) more than 6 noise SDs apart and each class keeps a
    solid piece (after an opening, so a thin partial-volume rim never counts) of at least
    ``min_vox`` voxels, every voxel goes to its nearest solid piece.
    """
    out, m = np.zeros_like(comps), 0
    for c in range(1, n + 1):
        comp = comps == c
        core = comp & (a < thr)
        pieces = []
        if np.count_nonzero(core) >= 2 * min_vox:
            v = a[core]
            t = threshold_otsu(v) if float(v.max() - v.min()) > 0 else float(v.max())
            lo, hi = core & (a <= t), core & (a > t)
            if lo.any() and hi.any() and float(np.median(a[hi]) - np.median(a[lo])) > 6.0 * sd:
                for part in (lo, hi):
                    lab, k = ndimage.label(ndimage.binary_opening(part), structure=np.ones((3, 3, 3)))
                    sizes = np.bincount(lab.ravel(), minlength=k + 1)[1:]
                    if k and sizes.max() >= min_vox:
                        pieces.append(lab == int(np.argmax(sizes)) + 1)
        if len(pieces) < 2:
            m += 1
            out[comp] = m
            continue
        seeds = np.zeros(comps.shape, np.int32)
        for j, piece in enumerate(pieces, start=1):
            seeds[piece] = j
        idx = ndimage.distance_transform_edt(seeds == 0, return_distances=False, return_indices=True)
        nearest = seeds[tuple(idx)]
        for j in range(1, len(pieces) + 1):
            out[comp & (nearest == j)] = m + j
        m += len(pieces)
    return out, m


def _box(ijk: np.ndarray) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    lo, hi = ijk.min(axis=0), ijk.max(axis=0) + 1
    return tuple(int(x) for x in lo), tuple(int(x) for x in hi)


def _refine_on_t2(core: np.ndarray, near: np.ndarray, t2: np.ndarray, zo_t2: np.ndarray | None,
                  normal: dict[int, tuple[float, float]]) -> np.ndarray:
    """The lesion's outline on the finer T2w grid: the half-way threshold between its own T2w
    signal and the normal signal of each zone, within one ADC voxel of the diffusion outline.

    The diffusion outline (``core``) is limited by the coarser ADC grid; T2w contrast (lesions
    are T2-dark) places the border at T2w resolution. Without clear contrast (< 3 noise SDs)
    the diffusion outline is kept.
    """
    lesion = float(np.median(t2[core]))
    zmap = np.ones(t2.shape, np.int16) if zo_t2 is None else zo_t2
    dark = np.zeros(t2.shape, dtype=bool)
    valid = []
    for z, (n_med, n_sd) in normal.items():
        # a zone darker than the lesion itself (e.g. TZ next to a mildly dark PZ lesion)
        # cannot be told apart from it on T2w: the border stays where diffusion put it there
        if n_med - lesion >= 3.0 * n_sd:
            valid.append(z)
            dark |= near & (zmap == z) & (t2 < 0.5 * (lesion + n_med))
    if not dark.any():
        return core
    dark |= core & ~np.isin(zmap, valid)
    lab, n = ndimage.label(dark, structure=np.ones((3, 3, 3)))
    hit = np.unique(lab[core & dark])
    refined = np.isin(lab, hit[hit > 0])
    return refined if refined.any() else core


def _lesion(idx: int, comp_adc: np.ndarray, a: np.ndarray, adc_aff: np.ndarray, on_t2: np.ndarray,
            gland: Mask, zo_t2: np.ndarray | None, t2: np.ndarray | None, normal_t2: dict[int, tuple[float, float]]) -> Finding | None:
    gl = np.asarray(gland.data) > 0
    m = (on_t2 >= 0.5) & gl
    if not m.any():
        return None
    if t2 is not None and normal_t2:
        m = _refine_on_t2(m, (on_t2 >= 0.1) & gl, t2, zo_t2, normal_t2)
    ijk = np.argwhere(m)
    world = vox2world(gland.affine, ijk)
    centroid = world.mean(axis=0)
    zone = ""
    if zo_t2 is not None:
        counts = np.bincount(zo_t2[m].astype(int), minlength=3)[1:3]
        zone = ZONE_NAMES[int(np.argmax(counts)) + 1] if counts.sum() else ""
    vals = a[comp_adc]
    attrs: dict[str, Any] = {
        "adc": float(np.median(vals)), "adc_mean": float(vals.mean()), "adc_min": float(vals.min()),
        "size_mm": max_diameter_mm(ijk, gland.affine), "centroid_world": [float(c) for c in centroid],
        "box_voxel_adc": [list(b) for b in _box(np.argwhere(comp_adc))], "grid": "gland (T2w)",
        "volume_ml_adc": float(comp_adc.sum() * abs(np.linalg.det(adc_aff[:3, :3])) / 1000.0)}
    zkey = {"PZ": 1, "TZ": 2}.get(zone)
    if t2 is not None and zkey in normal_t2:
        attrs["t2_ratio"] = float(np.median(t2[m]) / normal_t2[zkey][0])
    box_world = (tuple(float(x) for x in world.min(axis=0)), tuple(float(x) for x in world.max(axis=0)))
    return Finding(id=f"lesion_{idx}", label="lesion", box_voxel=_box(ijk), box_world=box_world,
                   volume_ml=float(m.sum() * gland.voxel_volume_ml), side="R" if centroid[0] > 0 else "L",
                   zone=zone, attributes=attrs)


@tool("detect.prostate_lesions", version="1.2", milestone="detection", resources={"num_cpus": 1, "memory_mb": 1024},
      output="findings")
def prostate_lesions(adc: Image, dwi: Image, gland: Mask, params: LesionParams, zones: Mask | None = None,
                     transform: Transform | None = None, t2w: Image | None = None) -> Findings:
    """Lesion candidates inside the prostate gland from low ADC and high DWI.

    Args:
        adc: ADC map (1e-6 mm2/s), on its own grid (preferred) or already on the gland's grid.
        dwi: high-b DWI on the ADC's grid.
        gland: gland mask on the T2w grid (the output grid of every box).
        params: thresholds and minimum size.
        zones: zone mask (1 PZ, 2 TZ) on the gland's grid: per-zone references and lesion zone.
        transform: fixed(T2w) -> moving(ADC) world matrix (``register.rigid``); None: aligned.
        t2w: the T2w image (gland grid), for each lesion's T2w ratio to its normal zone.

    Returns:
        Findings (affine = the gland's): per lesion ``box_voxel`` (T2w grid, inclusive min,
        exclusive max), ``box_world`` (RAS box of its voxel centres), ``volume_ml``, ``side`` (RAS
        x of the centroid), ``zone``, attributes ``adc`` (median, native grid), ``adc_mean``,
        ``size_mm`` (largest 3-D diameter), ``t2_ratio`` (when ``t2w``), ``box_voxel_adc``.

    Raises:
        ToolError: ``shape`` (not 3-D, adc/dwi or masks off-grid), ``numeric`` (NaN/Inf),
            ``value_range`` (empty gland, singular transform, params).
    """
    m = _check(adc, dwi, gland, zones, t2w, transform)
    a, d = np.asarray(adc.data, dtype=np.float32), np.asarray(dwi.data, dtype=np.float32)
    inv = np.linalg.inv(m)  # ADC world point -> T2w world point
    # Linear interpolation of the gland indicator, kept from 0.25: an ADC voxel partly inside the
    # gland counts (nearest neighbour from the 3.6 mm-thick T2w slices drops edge voxels, and
    # with them small peripheral lesions); the lesion outline is clipped to the gland on T2w.
    gl = _carry((np.asarray(gland.data) > 0), gland.affine, adc.affine, a.shape, inv, "linear") >= 0.25
    if not gl.any():
        raise ToolError(ErrorCode.value_range, "the gland does not overlap the ADC field of view",
                        hint="check the transform direction (fixed=T2w, moving=ADC)", arg="transform")
    zo_t2 = None if zones is None else np.rint(np.asarray(zones.data)).astype(np.int16)
    zo = (np.zeros(a.shape, np.int16) if zo_t2 is None
          else np.rint(_carry(zo_t2, gland.affine, adc.affine, a.shape, inv, "nearest")).astype(np.int16))
    core, loose, info = _candidates(a, d, gl, zo, params)
    voxel_ml = abs(np.linalg.det(np.asarray(adc.affine)[:3, :3])) / 1000.0
    min_vox = max(1, int(np.ceil(params.min_volume_ml / voxel_ml)))
    # A lesion exists when its core (restricted at the strict threshold) is large enough. Its
    # extent is the core grown by one voxel into the looser threshold (hysteresis: a lesion only
    # a few noise SDs below the reference shows up as scattered core voxels, and its box, size,
    # hence PI-RADS, would be too small); grown voxels go to the nearest core, so two lesions
    # that growth would join stay two.
    core_lab, n_core = ndimage.label(core, structure=np.ones((3, 3, 3)))
    core_sizes = np.bincount(core_lab.ravel(), minlength=n_core + 1)
    ids = np.flatnonzero(core_sizes >= min_vox)
    ids = ids[ids > 0]
    seeds = np.zeros(a.shape, np.int32)
    for j, cid in enumerate(ids, start=1):
        seeds[core_lab == cid] = j
    n = len(ids)
    grown = ndimage.binary_dilation(seeds > 0, structure=np.ones((3, 3, 3)), mask=loose) if n else seeds > 0
    if n:
        idx = ndimage.distance_transform_edt(seeds == 0, sampling=adc.spacing, return_distances=False,
                                             return_indices=True)
        comps = np.where(grown | (seeds > 0), seeds[tuple(idx)], 0).astype(np.int32)
    else:
        comps = seeds
    comps, n = _split_levels(comps, n, a, info["adc_threshold"], info["adc_noise_sd"], min_vox)
    sizes = ndimage.sum_labels(np.ones_like(a), comps, index=np.arange(1, n + 1)) * voxel_ml if n else np.zeros(0)
    keep = [int(i) + 1 for i in np.argsort(-sizes) if sizes[i] >= params.min_volume_ml]
    keep = keep[: params.max_lesions]
    t2 = None if t2w is None else np.asarray(t2w.data, dtype=np.float64)
    normal_t2: dict[int, tuple[float, float]] = {}
    if t2 is not None and zo_t2 is not None:
        lesion_t2 = _carry(np.isin(comps, keep), adc.affine, gland.affine, t2.shape, m, "linear") >= 0.25
        for z in (1, 2):
            sel = (zo_t2 == z) & ~lesion_t2
            if sel.any():
                normal_t2[z] = _robust(t2[sel])
    items = []
    for comp_id in keep:
        comp = comps == comp_id
        on_t2 = _carry(comp, adc.affine, gland.affine, np.shape(gland.data), m, "linear")
        f = _lesion(len(items) + 1, comp, a, adc.affine, on_t2, gland, zo_t2, t2, normal_t2)
        if f is not None:
            items.append(f)
    meta = {"method": "ADC/DWI thresholds on the native ADC grid, 26-connected components",
            "candidates": int(n), "transform": "given" if transform is not None else "identity (world-aligned)",
            **info}
    log.debug("detect.prostate_lesions: %d lesions (%d components)", len(items), n)
    return Findings(items, np.array(gland.affine, dtype=np.float64), meta)
