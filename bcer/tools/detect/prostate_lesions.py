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

Rule (PI-RADS v2.1 reads a lesion against the zone it sits in; the ADC/DWI pair is the
evidence on both zones here, T2w sets each lesion's outline and its T2 ratio):

1. Reference: each zone's normal ADC level from its interior (``_normal_level``: the median,
   or its upper class when a lesion fills much of the zone); each voxel is read against its
   own zone's level, against the lower of the two levels in a band along the PZ/TZ border
   where the zone masks are uncertain (``_border_band``).
2. Evidence: the ADC and DWI are averaged within each zone over solid gland voxels
   (Gaussian, ``smooth_mm``; fat at the capsule and the other zone never bleed in); a voxel
   is a candidate when its smoothed ADC lies ``adc_contrast`` and ``adc_margin_sd`` smoothed
   noise SDs below its reference and its smoothed DWI is not below the darkest zone's median
   (``dwi_ratio``). Where nothing solid is around (the gland's edge) and in a rim of
   ``rim_mm`` outside the mask (segmentations leave out T2-dark lesions at the capsule), a
   voxel must carry the evidence itself: low ADC and DWI ``edge_dwi_ratio`` x its zone's.
3. Lesions: candidate components of at least ``min_volume_ml`` that reach into the gland,
   grown by one voxel (hysteresis), split when they hold two lesions of clearly different
   ADC (``_split_levels``), outlined on the raw ADC and DWI by the half-maximum rule and
   kept only when that outline's own ADC is restricted (``_outline``); an outline never takes
   the voxels of another lesion's component (two lesions side by side stay two). On T2w a
   lesion is reported over its part inside the gland mask when that is at least half of it,
   else over all of it, rim included (a mask that cut a lesion off leaves a sliver inside).
4. PZ reading (``pz_reading``): the band reads its voxels against the lower (TZ) level, which
   hides a PZ lesion whose ADC is above the TZ's normal level when the band reaches it (next
   to the TZ, or around a TZ label the segmentation puts on the T2-dark lesion itself). Steps
   2-3 run again with every voxel read against its own zone's level; a lesion found there
   that touches none of the first reading's is kept when it is a PZ lesion: mostly PZ on the
   ADC grid and on the T2w zones (TZ tissue labelled PZ at the border outlines on the TZ side
   of the finer T2w zones, and is dropped) (``_pz_reading``).
5. What is not a lesion whatever the mask says (``periprostatic.not_a_lesion``): a
   gland mask one voxel too large (within what two networks or two machines give) takes in
   periprostatic tissue that reads as restricted against the zone. Fat has a very low ADC but
   no DWI signal (``blackout_adc_ratio``; at a low b-value less DWI is asked,
   ``blackout_s0_ratio``); the capsule has an ADC 20-30 % below the PZ's and a T2w like a
   lesion's, and enters as a sheet one voxel wide along the mask's edge, which PI-RADS v2.1
   calls linear (score 2) unless it is markedly DWI-bright (``linear_length_vox``). "Markedly DWI-bright" is ``edge_dwi_ratio``
   x the zone's normal-tissue DWI in both rules.
6. Outline on T2w (``_refine_on_t2``): the half-way cut between the lesion's own T2w signal
   and each zone's normal signal, within one ADC voxel of the diffusion outline. Within
   ``border_mm`` of the other zone the darker zone's cut applies (``t2_border_band``): TZ
   tissue the zone masks label PZ lies well below the PZ's cut and would extend a TZ lesion
   by a voxel at its ends (its largest diameter, which PI-RADS compares with 15 mm). Where the
   outline holds two separate T2-dark parts of at least ``min_volume_ml`` each, they are
   two lesions (``t2_split``; the diffusion grid joined them), each with the ADC voxels
   nearest to it (``outline``).

The noise SD comes from neighbour differences (tissue structure cancels); every size is in
mL/mm, so the rule is the same on the small and full grids.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

import numpy as np
from scipy import ndimage
from skimage.filters import threshold_otsu
from skimage.morphology import convex_hull_image

from ...contracts.artifacts import Finding, Findings, Image, Mask, Transform
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.geometry import same_grid, vox2world
from ...io.sitk_bridge import ras_to_transform
from .._checks import require_ndim, require_nonempty, require_same_grid, require_volume
from ..quant import max_diameter_mm
from ..registry import tool
from ..resample import resample_onto
from .outline import adc_share, t2_parts
from .outline import refine_on_t2 as _refine_on_t2
from .params import LesionParams
from .periprostatic import b_value, not_a_lesion
from .reference import (ZONE_NAMES, _border_band, _interior, _noise_sd, _references, _robust, _smoothed,
                        _zone_masks)

log = logging.getLogger(__name__)



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


class _Maps(NamedTuple):
    """What the candidate step leaves for the later ones (all on the ADC grid)."""

    core: np.ndarray  # candidate voxels: restricted at the strict threshold (closed)
    loose: np.ndarray  # voxels below the looser threshold a lesion may grow into
    sa: np.ndarray  # within-zone smoothed ADC
    ref: np.ndarray  # each voxel's normal ADC (its zone's level; the lower one at the zone border)
    thr: np.ndarray  # the strict threshold on ``sa``
    dref: np.ndarray  # each voxel's zone median DWI
    dnorm: np.ndarray  # each voxel's zone normal-tissue DWI (at the zone's normal ADC level)
    gl: np.ndarray  # where lesions are searched: gland voxels and the rim around them
    covered: np.ndarray  # gland voxels with solid tissue around them (``sa`` is an average there)
    info: dict[str, Any]


def _rim(gl: np.ndarray, spacing: tuple[float, ...], rim_mm: float) -> np.ndarray:
    """Voxels outside the gland within ``rim_mm`` of it and inside its convex outline (per slice
    of the grid's third axis): a notch the mask left out, never the rectal wall or fat around
    a convex gland."""
    if rim_mm <= 0 or not gl.any():
        return np.zeros(gl.shape, bool)
    hull = np.zeros(gl.shape, bool)
    for k in range(gl.shape[2]):
        if np.count_nonzero(gl[..., k]) >= 3:
            hull[..., k] = convex_hull_image(gl[..., k])
    return hull & ~gl & (ndimage.distance_transform_edt(~gl, sampling=spacing) <= rim_mm)


def _reaching(core: np.ndarray, gl: np.ndarray) -> np.ndarray:
    """The components of ``core`` that reach into the gland or touch it."""
    lab, n = ndimage.label(core, structure=np.ones((3, 3, 3)))
    if not n:
        return core
    grown = ndimage.grey_dilation(lab, footprint=np.ones((3, 3, 3), bool))
    hit = np.unique(np.r_[lab[core & gl], grown[gl]])
    return np.isin(lab, hit[hit > 0])


def _candidates(a: np.ndarray, d: np.ndarray, frac: np.ndarray, zo: np.ndarray, spacing: tuple[float, ...],
                p: LesionParams, band_ref: bool = True) -> _Maps:
    """Candidate voxels (step 2 of the module rule) and what the later steps read.
    ``frac`` is the gland's share of each ADC voxel; ``band_ref`` False: every voxel is read
    against its own zone's level, in the border band too (the PZ reading, step 4)."""
    gl = frac >= 0.25
    zones = _zone_masks(gl, zo)
    sigma = np.asarray([p.smooth_mm / s for s in spacing]) if p.smooth_mm > 0 else np.zeros(3)
    inner = {name: _interior(sel, spacing, p.border_mm) for name, sel in zones.items()}
    band = _border_band(zones, spacing, p.border_mm)
    sa, sdw, covered = _smoothed(a, d, frac, zones, inner, band, sigma)
    sd = _noise_sd(a, inner)
    sd_s = max(min(_robust(sa[m])[1] for m in inner.values()), 1e-6)  # noise left after smoothing
    area = gl | _rim(gl, spacing, p.rim_mm)
    ref, dref, dnorm, levels = _references(a, d, zones, inner, band if band_ref else np.zeros_like(band), area,
                                           spacing, sd)
    thr = ref - np.maximum(np.maximum(p.adc_margin_sd * sd_s, p.adc_contrast * ref), p.adc_margin_min)
    dwi_thr = p.dwi_ratio * min(float(np.median(d[m])) for m in inner.values())
    bright = sdw > dwi_thr
    # at the edge and outside the mask, where nothing solid is around to average, a voxel
    # speaks for itself only with marked DWI hyperintensity
    edge = area & ~covered & (a < thr) & (d > p.edge_dwi_ratio * dref)
    # noise holes inside a lesion must not split it into pieces
    core = ndimage.binary_closing((gl & covered & (sa < thr) & bright) | edge, iterations=1) & area
    core = _reaching(core, gl)
    grow = np.maximum(thr, ref - max(p.grow_margin_sd * sd_s, p.adc_margin_min)) if p.grow_margin_sd > 0 else thr
    loose = area & (sa < grow) & bright
    info = {"zone_adc_median": levels, "adc_noise_sd": sd, "adc_noise_sd_smoothed": sd_s,
            "adc_threshold_zone": {n: float(levels[n] - max(p.adc_margin_sd * sd_s, p.adc_contrast * levels[n],
                                                             p.adc_margin_min)) for n in levels},
            "dwi_threshold": dwi_thr, "smooth_mm": p.smooth_mm}
    info["adc_threshold"] = min(info["adc_threshold_zone"].values())
    return _Maps(core, loose, sa, ref, thr, dref, dnorm, area, covered, info)


def _split_levels(comps: np.ndarray, n: int, a: np.ndarray, thr: np.ndarray, sd: float,
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


def _outline(comps: np.ndarray, n: int, a: np.ndarray, d: np.ndarray, mp: _Maps, contrast: float
             ) -> tuple[np.ndarray, int]:
    """Each lesion's outline on the native (unsmoothed) ADC and DWI, and the lesions it confirms.

    Smoothing finds a lesion but widens it; its outline is where the raw ADC lies below half
    way between the lesion's own level and its zone's reference and the raw DWI above half way
    between the lesion's DWI and its zone's median, within one voxel of the smoothed outline
    (the half-maximum rule on both; fat at the capsule has a low ADC but no DWI). The lesion's
    level starts as the median over the half-maximum of its smoothed dip and is iterated
    (Ridler-Calvard): a small lesion's half-maximum also holds normal neighbours. A lesion
    whose outlined voxels' median ADC is not ``contrast`` below the reference is dropped: the
    smoothed map alone never makes a lesion."""
    out, m = np.zeros_like(comps), 0
    ball = np.ones((3, 3, 3), bool)
    for c in range(1, n + 1):
        comp = comps == c
        solid = comp & (mp.covered | mp.core)
        if not solid.any():
            continue
        r, low, dr = float(np.median(mp.ref[comp])), float(mp.sa[solid].min()), float(np.median(mp.dref[comp]))
        seed = solid & (mp.sa <= 0.5 * (low + r))
        near = ndimage.binary_dilation(comp, ball) & mp.gl & (out == 0) & ((comps == 0) | comp)
        level, dlevel = float(np.median(a[seed])), float(np.median(d[seed]))
        for _ in range(3):
            inside = near & (a < 0.5 * (level + r)) & (d > 0.5 * (dlevel + dr))
            if not inside.any():
                break
            level, dlevel = float(np.median(a[inside])), float(np.median(d[inside]))
        inside = near & (a < 0.5 * (level + r)) & (d > 0.5 * (dlevel + dr))
        ext = ndimage.binary_closing(inside, ball) & near
        lab, k = ndimage.label(ext, structure=ball)
        hit = np.unique(lab[seed & ext])
        ext = np.isin(lab, hit[hit > 0]) if k else ext
        if not ext.any() or float(np.median(a[ext])) >= (1.0 - contrast) * r:
            continue
        m += 1
        out[ext] = m
    return out, m


def _components(a: np.ndarray, d: np.ndarray, mp: _Maps, p: LesionParams, min_vox: int,
                spacing: tuple[float, ...]) -> tuple[np.ndarray, int]:
    """Step 3 of the module rule on one reading's candidate maps: grown, split and outlined."""
    comps, n = _grow_components(mp.core, mp.loose, min_vox, spacing)
    comps, n = _split_levels(comps, n, a, mp.thr, mp.info["adc_noise_sd"], min_vox)
    return _outline(comps, n, a, d, mp, p.adc_contrast)


def _pz_reading(comps: np.ndarray, n: int, own: tuple[np.ndarray, int], zo: np.ndarray
                ) -> tuple[np.ndarray, int, set[int]]:
    """Add the lesions of the own-zone reading (``own``: every voxel against its own zone's
    level, the border band too) that the band reading missed and that lie mostly in the PZ.

    The band reads a voxel near the other zone against the lower (TZ) level, since TZ tissue
    the zone masks put in the PZ would otherwise pass for PZ restriction. A PZ lesion whose
    ADC is above the TZ's normal level then goes unseen when the band reaches it: next to
    the TZ, or near a TZ label the segmentation puts on the T2-dark lesion itself. Read
    against the PZ level, it is kept only as a PZ lesion (most of its ADC voxels labelled PZ
    here, its T2w outline mostly PZ in ``prostate_lesions``) touching no lesion of the band
    reading: TZ tissue mislabelled PZ outlines mostly on the TZ side on the finer T2w zones.
    Returns the labels, their count and the ids added."""
    own_lab, n_own = own
    taken = ndimage.binary_dilation(comps > 0, np.ones((3, 3, 3), bool))
    added = set()
    for c in range(1, n_own + 1):
        comp = own_lab == c
        if (comp & taken).any() or np.count_nonzero(zo[comp] == 1) * 2 <= np.count_nonzero(comp):
            continue
        n += 1
        comps[comp] = n
        added.add(n)
    return comps, n, added


def _box(ijk: np.ndarray) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    lo, hi = ijk.min(axis=0), ijk.max(axis=0) + 1
    return tuple(int(x) for x in lo), tuple(int(x) for x in hi)


def _t2_outline(on_t2: np.ndarray, gland: Mask, gl: np.ndarray, zo_t2: np.ndarray | None, t2: np.ndarray | None,
                normal_t2: dict[int, tuple[float, float]], on_grid: bool = False,
                band_t2: np.ndarray | None = None) -> tuple[np.ndarray, bool] | None:
    """A lesion's outline on the T2w grid from its carried indicator ``on_t2``, and whether the
    T2w cut set it (:func:`.outline.refine_on_t2`); ``gl`` is the search area there
    (gland and rim), ``zo_t2`` the zones with the rim given its nearest zone; ``on_grid``:
    diffusion was resampled onto the T2w grid. None when nothing of it is in ``gl``."""
    m = (on_t2 >= 0.5) & gl
    if not m.any():
        return None
    # the rim finds a lesion the gland mask left out; what is reported is its part inside the
    # mask when that holds at least half of it (a finding is a gland finding), else all of it:
    # a sliver inside a mask that cut the lesion off is the segmentation's error, not its extent
    inside = np.asarray(gland.data) > 0
    if np.count_nonzero(m & inside) * 2 >= np.count_nonzero(m):
        m, gl = m & inside, inside
    if t2 is None or not normal_t2:
        return m, False
    # within one diffusion voxel of the diffusion outline: the 0.1 level of the carried
    # indicator on the native grid; one voxel when diffusion was resampled onto this grid
    near = ndimage.binary_dilation(m, np.ones((3, 3, 3), bool)) if on_grid else on_t2 >= 0.1
    refined = _refine_on_t2(m, near & gl, t2, zo_t2, normal_t2, band_t2)
    return refined, refined is not m


def _gland_side(centroid: np.ndarray, gland: Mask) -> str:
    """The lesion's side relative to the gland's own midline (a sagittal plane through the
    gland's centroid, RAS: > 0 is the patient's right), never the sign of a world coordinate."""
    x0 = float(vox2world(gland.affine, np.argwhere(np.asarray(gland.data) > 0).mean(axis=0))[0])
    return "R" if centroid[0] > x0 else "L"


def _finding(idx: int, m: np.ndarray, comp_adc: np.ndarray, a: np.ndarray, adc_aff: np.ndarray, gland: Mask,
             zo_t2: np.ndarray | None, t2: np.ndarray | None, normal_t2: dict[int, tuple[float, float]]) -> Finding:
    """One finding: outline ``m`` on the T2w grid, its diffusion values from ``comp_adc``."""
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
                   volume_ml=float(m.sum() * gland.voxel_volume_ml), side=_gland_side(centroid, gland),
                   zone=zone, attributes=attrs)


def _split_on_t2(outline: tuple[np.ndarray, bool], comp: np.ndarray, adc_aff: np.ndarray, gland: Mask,
                 matrix: np.ndarray, p: LesionParams) -> list[tuple[np.ndarray, np.ndarray]]:
    """(T2w outline, ADC voxels) per lesion: one pair, or one per separate lesion-sized part of
    an outline the T2w cut set (``t2_split``; :func:`.outline.t2_parts`)."""
    whole = [(outline[0], comp)]
    if not (outline[1] and p.t2_split):
        return whole
    parts = t2_parts(outline[0], gland.voxel_volume_ml, p.min_volume_ml)  # each part a lesion's size
    shares = adc_share(comp, parts, adc_aff, gland.affine, matrix) if len(parts) > 1 else None
    return whole if shares is None else list(zip(parts, shares))


def _masks_on_adc(gland: Mask, zones: Mask | None, adc: Image, inv: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The gland's share of each ADC voxel, the zones on the ADC grid, the zone labels on T2w.

    Linear interpolation of the gland indicator, kept from 0.25: an ADC voxel partly inside the
    gland counts (nearest neighbour from the 3.6 mm-thick T2w slices drops edge voxels, and
    with them small peripheral lesions); the lesion outline is clipped to the gland on T2w."""
    shape = np.shape(adc.data)
    frac = np.clip(_carry((np.asarray(gland.data) > 0), gland.affine, adc.affine, shape, inv, "linear"), 0.0, 1.0)
    if not (frac >= 0.25).any():
        raise ToolError(ErrorCode.value_range, "the gland does not overlap the ADC field of view",
                        hint="check the transform direction (fixed=T2w, moving=ADC)", arg="transform")
    zo_t2 = None if zones is None else np.rint(np.asarray(zones.data)).astype(np.int16)
    zo = (np.zeros(shape, np.int16) if zo_t2 is None
          else np.rint(_carry(zo_t2, gland.affine, adc.affine, shape, inv, "nearest")).astype(np.int16))
    return frac, zo, zo_t2


def _grow_components(core: np.ndarray, loose: np.ndarray, min_vox: int, spacing: tuple[float, ...]
                     ) -> tuple[np.ndarray, int]:
    """Lesion labels: every core component of at least ``min_vox`` voxels, grown by one voxel
    into ``loose`` (hysteresis: a lesion only a few noise SDs below the reference shows up as
    scattered core voxels, and its box, size, hence PI-RADS, would be too small); grown voxels
    go to the nearest core, so two lesions that growth would join stay two."""
    core_lab, n_core = ndimage.label(core, structure=np.ones((3, 3, 3)))
    core_sizes = np.bincount(core_lab.ravel(), minlength=n_core + 1)
    ids = np.flatnonzero(core_sizes >= min_vox)
    ids = ids[ids > 0]
    seeds = np.zeros(core.shape, np.int32)
    for j, cid in enumerate(ids, start=1):
        seeds[core_lab == cid] = j
    if not len(ids):
        return seeds, 0
    grown = ndimage.binary_dilation(seeds > 0, structure=np.ones((3, 3, 3)), mask=loose)
    idx = ndimage.distance_transform_edt(seeds == 0, sampling=spacing, return_distances=False, return_indices=True)
    return np.where(grown | (seeds > 0), seeds[tuple(idx)], 0).astype(np.int32), len(ids)


def _normal_t2(t2: np.ndarray | None, zo_t2: np.ndarray | None, lesions_adc: np.ndarray, adc_aff: np.ndarray,
               t2_aff: np.ndarray, m: np.ndarray) -> dict[int, tuple[float, float]]:
    """Robust (median, SD) of each zone's T2w signal outside the lesions found."""
    if t2 is None or zo_t2 is None:
        return {}
    lesion_t2 = _carry(lesions_adc, adc_aff, t2_aff, t2.shape, m, "linear") >= 0.25
    out = {}
    for z in (1, 2):
        sel = (zo_t2 == z) & ~lesion_t2
        if sel.any():
            out[z] = _robust(t2[sel])
    return out


def _area_on_t2(gland: Mask, zo_t2: np.ndarray | None, rim_mm: float) -> tuple[np.ndarray, np.ndarray | None]:
    """The search area on the T2w grid (gland and rim) and the zones there, each rim voxel
    taking its nearest zone."""
    gl = np.asarray(gland.data) > 0
    rim = _rim(gl, gland.spacing, rim_mm)
    if zo_t2 is None or not rim.any():
        return gl | rim, zo_t2
    idx = ndimage.distance_transform_edt(zo_t2 == 0, sampling=gland.spacing, return_distances=False,
                                         return_indices=True)
    return gl | rim, np.where(rim, zo_t2[tuple(idx)], zo_t2)


@tool("detect.prostate_lesions", version="1.8", milestone="detection", resources={"num_cpus": 1, "memory_mb": 1024},
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
        exclusive max), ``box_world`` (RAS box of its voxel centres), ``volume_ml``, ``side`` ("R"
        when the centroid lies right of a sagittal plane through the gland's centroid, RAS),
        ``zone``, attributes ``adc`` (median, native grid), ``adc_mean``,
        ``size_mm`` (largest 3-D diameter), ``t2_ratio`` (when ``t2w``), ``box_voxel_adc``.

    Raises:
        ToolError: ``shape`` (not 3-D, adc/dwi or masks off-grid), ``numeric`` (NaN/Inf),
            ``value_range`` (empty gland, singular transform, params).
    """
    m = _check(adc, dwi, gland, zones, t2w, transform)
    a, d = np.asarray(adc.data, dtype=np.float32), np.asarray(dwi.data, dtype=np.float32)
    frac, zo, zo_t2 = _masks_on_adc(gland, zones, adc, np.linalg.inv(m))
    mp = _candidates(a, d, frac, zo, adc.spacing, params)
    voxel_ml = abs(np.linalg.det(np.asarray(adc.affine)[:3, :3])) / 1000.0
    min_vox = max(1, int(np.ceil(params.min_volume_ml / voxel_ml)))
    comps, n = _components(a, d, mp, params, min_vox, adc.spacing)
    pz_read: set[int] = set()
    if params.pz_reading and {"PZ", "TZ"} <= set(mp.info["zone_adc_median"]):
        comps, n, pz_read = _pz_reading(comps, n, _components(a, d, _candidates(a, d, frac, zo, adc.spacing, params,
                                                                                band_ref=False),
                                                              params, min_vox, adc.spacing), zo)
    sizes = ndimage.sum_labels(np.ones_like(a), comps, index=np.arange(1, n + 1)) * voxel_ml if n else np.zeros(0)
    dropped, depth = {}, ndimage.distance_transform_edt(frac >= 0.5, sampling=adc.spacing)
    b = b_value(dwi)
    for c in range(1, n + 1) if params.periprostatic_rules else ():
        why = "" if sizes[c - 1] < params.min_volume_ml else not_a_lesion(
            comps == c, a, d, mp.ref, mp.dnorm, depth, adc.spacing, np.asarray(adc.affine), params, b)
        if why:
            dropped[c] = why
            log.debug("detect.prostate_lesions: component %d dropped: %s", c, why)
    keep = [int(i) + 1 for i in np.argsort(-sizes)
            if sizes[i] >= params.min_volume_ml and int(i) + 1 not in dropped][: params.max_lesions]
    t2 = None if t2w is None else np.asarray(t2w.data, dtype=np.float64)
    normal_t2 = _normal_t2(t2, zo_t2, np.isin(comps, keep), adc.affine, gland.affine, m)
    area_t2, zo_area = _area_on_t2(gland, zo_t2, params.rim_mm)
    band_t2 = None
    if keep and t2 is not None and zo_area is not None and params.t2_border_band:  # two EDTs on the T2w grid
        band_t2 = _border_band({"PZ": zo_area == 1, "TZ": zo_area == 2}, gland.spacing, params.border_mm)
    on_grid = same_grid(adc.affine, a.shape, gland.affine, np.shape(gland.data), 1e-6)
    items, n_split = [], 0
    for comp_id in keep:
        comp = comps == comp_id
        on_t2 = _carry(comp, adc.affine, gland.affine, np.shape(gland.data), m, "linear")
        outline = _t2_outline(on_t2, gland, area_t2, zo_area, t2, normal_t2, on_grid, band_t2)
        if outline is None:
            continue
        pairs = _split_on_t2(outline, comp, adc.affine, gland, m, params)
        n_split += len(pairs) > 1
        for part, share in pairs:
            f = _finding(len(items) + 1, part, share, a, adc.affine, gland, zo_area, t2, normal_t2)
            # a lesion read against the PZ's level is a PZ lesion on the T2w zones, or nothing
            if comp_id not in pz_read or f.zone == "PZ":
                items.append(f)
    items = items[: params.max_lesions]
    meta = {"method": "within-zone smoothed ADC against its zone's normal level, DWI not hypointense, on the "
                      "native ADC grid; 26-connected components; PZ side of the zone border also read against "
                      "the PZ level",
            "candidates": int(n), "pz_read": len(pz_read), "split_on_t2": n_split,
            "not_lesions": sorted(dropped.values()),
            "transform": "given" if transform is not None else "identity (world-aligned)",
            **mp.info}
    log.debug("detect.prostate_lesions: %d lesions (%d components)", len(items), n)
    return Findings(items, np.array(gland.affine, dtype=np.float64), meta)
