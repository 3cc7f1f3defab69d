"""The classical method of ``seg.cardiac``: RV (1), MYO (2), LV (3) from intensity levels of the cine.

``seg.cardiac`` runs it alone (``method="classical"``), as the LV cavity of its hybrid, and as
the fallback when the network cannot run or fails its checks. Steps:

1. heart region: per slice, the convex hull of the voxels whose intensity changes over the
   cycle (temporal range, Otsu); fat and vessels are static, the ventricles' borders move;
2. blood: brighter than half-way between the bright and dark classes of the heart region;
3. per frame, the bright 3-D components mostly inside the heart region are the cavities;
   the LV is first guessed as the most convex one (round in every slice; the RV is a
   crescent), then made consistent over the cycle: each frame takes the candidate that
   overlaps most the voxels most frames call LV (a round vessel or a cavity merged with
   the RV in one frame no longer wins that frame); the RV is every other sizeable cavity
   within a wall's reach of the LV; end slices whose "LV" fills while the ventricle
   empties are a left atrium and are dropped (:mod:`.cardiac_atrium`);
4. myocardium: levels from the image (the myocardium: median over rays from the LV centre
   of the darkest smoothed value 0.5-2.5 voxels beyond the endocardium, clear of the
   blurred blood edge; the tissue around the heart region brighter than that); along rays
   the wall runs while the smoothed intensity stays between half the myocardium level
   (lung) and half-way to the tissue level; the epicardial radius per angle is
   median-filtered over neighbouring angles.

Limitation of the classical method (measured, ``benchmarks/cardiac_families.py --method
classical``): the basal slice that the mitral plane crosses during systole (ventricle at
ED, atrium at ES) keeps the atrium as LV in the frames where it is atrium.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import ndimage as ndi
from skimage.filters import threshold_otsu
from skimage.measure import regionprops
from skimage.morphology import convex_hull_image

from ...contracts.artifacts import Cine
from ...contracts.errors import ErrorCode, ToolError
from ._common import fill_holes_2d
from .cardiac_atrium import atrium_in_cycle

_CONN3 = ndi.generate_binary_structure(3, 1)
_CROSS2 = ndi.generate_binary_structure(2, 1)[..., None]  # in-plane 4-neighbourhood
_N_ANGLES = 48

def _levels(data: np.ndarray, heart: np.ndarray) -> tuple[float, float]:
    """(bright, dark) class medians of the heart region over the cycle (Otsu split)."""
    vals = data[np.broadcast_to(heart[..., None], data.shape)]
    split = float(threshold_otsu(vals))
    return float(np.median(vals[vals > split])), float(np.median(vals[vals <= split]))


def _heart_region(data: np.ndarray) -> np.ndarray:
    """Per slice, the convex hull of the voxels that move over the cycle (dilated).

    Only the cavities' borders move (their centres stay blood), so the hull, not the moving
    voxels themselves, covers the ventricles; static fat and vessels stay outside.
    """
    # The range is taken on a lightly smoothed cine, and the cut is the larger of Otsu's and
    # a robust noise ceiling (median + 6 MADs of the range): on a noisy cine the moving
    # voxels are a percent of the image and Otsu alone split the noise itself, so the "heart
    # region" became the whole field of view.
    smooth = ndi.gaussian_filter(data, sigma=(0.7, 0.7, 0.0, 0.0))
    rng = smooth.max(axis=3) - smooth.min(axis=3)
    med = float(np.median(rng))
    ceiling = med + 6.0 * 1.4826 * float(np.median(np.abs(rng - med)))
    moving = rng > max(float(threshold_otsu(rng)), ceiling)
    lab, n = ndi.label(moving, _CONN3)
    # Noise specks move too, but are a few voxels; a dilated, poorly contracting LV's border
    # moves by about a voxel and breaks into pieces a tenth of the RV's, so the cut is low.
    if n > 1:
        sizes = np.bincount(lab.ravel())[1:]
        moving = np.isin(lab, 1 + np.flatnonzero(sizes >= max(8.0, 0.05 * sizes.max())))
    region = np.zeros_like(moving)
    for k in range(moving.shape[2]):
        if moving[..., k].sum() >= 3:
            region[..., k] = convex_hull_image(moving[..., k])
    return ndi.binary_dilation(region, np.ones((3, 3, 1), bool), iterations=2)


def _solidity(comp: np.ndarray) -> float:
    """Area-weighted mean per-slice solidity (area / convex area) of a 3-D component."""
    num = den = 0.0
    for k in range(comp.shape[2]):
        sl = comp[..., k]
        a = int(sl.sum())
        if a < 4:
            continue
        props = regionprops(sl.astype(np.uint8))
        num += a * float(props[0].solidity)
        den += a
    return num / den if den else 0.0


def _pieces_2d(mask: np.ndarray) -> list[np.ndarray]:
    """In-plane pieces of a 2-D mask, thin bridges cut (as ``_split_bridges``, in one slice)."""
    lab, n = _split_bridges(mask[..., None], conn=ndi.generate_binary_structure(3, 1) * _CROSS2)
    return [lab[..., 0] == i for i in range(1, n + 1) if (lab == i).any()]


def _split_bridges(bright: np.ndarray, conn: np.ndarray = _CONN3) -> tuple[np.ndarray, int]:
    """Label the bright voxels so that cavities touching through a thin bridge come apart.

    A thin septum under noise and blur leaves a 1-2 voxel bright bridge that merges LV and
    RV into one component in some frames. An in-plane erosion cuts such bridges (an opening
    does not: it restores a short bridge from its thick ends); the eroded components are the
    seeds, and every bright voxel joins the seed it is connected to by the shortest bright
    path (geodesic growth), so nothing is lost at the edges or at a thin apex. Bright voxels
    no seed reaches keep components of their own.
    """
    seeds, n = ndi.label(ndi.binary_erosion(bright, structure=_CROSS2), conn)
    lab = seeds
    for _ in range(64):
        grown = np.where((lab == 0) & bright, ndi.grey_dilation(lab, footprint=conn), lab)
        if np.array_equal(grown, lab):
            break
        lab = grown
    rest, m = ndi.label(bright & (lab == 0), conn)
    return np.where(rest > 0, rest + n, lab), n + m


def _candidates(bright: np.ndarray, heart: np.ndarray) -> list[np.ndarray]:
    """Bright 3-D components of one frame that lie mostly inside the heart region (and are
    not tiny next to the largest)."""
    lab, n = _split_bridges(bright)
    cands = []
    for i in range(1, n + 1):
        comp = lab == i
        size = int(comp.sum())
        inside = comp & heart
        if size >= 8 and inside.sum() >= 0.5 * size:
            cands.append(comp)
        elif inside.sum() >= 8:
            # where body tissue is nearly as bright as blood (gradient-echo-like contrast), the
            # RV joins the body through its thin free wall; its part in the heart region is the cavity
            cands.append(inside)
    if not cands:
        return []
    big = max(int(c.sum()) for c in cands)
    return [c for c in cands if c.sum() >= 0.1 * big]


def _pick_lv(cands: list[list[np.ndarray]]) -> tuple[list[int | None], np.ndarray | None]:
    """Index of the LV among each frame's candidates, consistent over the cycle.

    First guess per frame: the most convex candidate (the LV is round in every slice, the RV
    a crescent). A left atrium or a vessel is round too and wins in a few frames; the voxels
    that most frames call LV form a consensus core, and each frame then takes the candidate
    that overlaps that core most (the first guess where none does).
    """
    first = [int(np.argmax([_solidity(c) for c in cs])) if cs else None for cs in cands]
    picked = [cs[i] for cs, i in zip(cands, first) if i is not None]
    if not picked:
        return first, None
    core = np.sum(picked, axis=0) >= 0.5 * len(picked)
    out = []
    for cs, i in zip(cands, first):
        overlap = [int((c & core).sum()) for c in cs]
        out.append(int(np.argmax(overlap)) if overlap and max(overlap) > 0 else i)
    return out, core


def _lv_per_slice(lv: np.ndarray, core: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(LV, the rest): per slice, the one in-plane piece of the LV candidate that overlaps the
    consensus core most (the most convex one when none does).

    On an oblique stack with thick slices the LV in one slice overlaps the RV in the next, so
    a 3-D component can hold both; in-plane the two are separate pieces.
    """
    keep = np.zeros_like(lv)
    for k in range(lv.shape[2]):
        pieces = _pieces_2d(lv[..., k]) if lv[..., k].any() else []
        if len(pieces) <= 1:
            keep[..., k] = lv[..., k]
            continue
        overlap = [int((pc & core[..., k]).sum()) if core is not None else 0 for pc in pieces]
        if max(overlap) > 0:
            best = int(np.argmax(overlap))
        else:
            best = int(np.argmax([pc.sum() * _solidity(pc[..., None]) for pc in pieces]))
        keep[..., k] = pieces[best]
    return keep, lv & ~keep


def _cavities(cands: list[np.ndarray], i_lv: int | None, core: np.ndarray | None,
              spacing: tuple[float, float, float], max_wall: float) -> tuple[np.ndarray, np.ndarray]:
    """(LV, RV) boolean volumes for one frame: the chosen LV candidate (one in-plane piece
    per slice), and as RV every other sizeable candidate within a wall's reach of it (a
    crescent may break into pieces near the base or apex)."""
    if i_lv is None:
        return None, None  # type: ignore[return-value]
    lv, rest = _lv_per_slice(cands[i_lv], core)
    cands = cands + [rest] if rest.any() else cands
    lv_size = int(lv.sum())
    reach = np.stack([ndi.distance_transform_edt(~lv[..., k], sampling=spacing[:2]) <= max_wall + 5.0
                      for k in range(lv.shape[2])], axis=-1)
    rv = np.zeros_like(lv)
    for j, c in enumerate(cands):
        if j != i_lv and (c & reach).any() and c.sum() >= 0.05 * lv_size:
            rv |= c
    return lv, rv


def _repick_lost_frames(cands: list[list[np.ndarray]], cavities: list[tuple[np.ndarray, np.ndarray]],
                        spacing: tuple[float, float, float], max_wall: float) -> list[int]:
    """Re-pick the LV of frames whose cavity collapses between its neighbours (in place).

    A cavity a fraction of both neighbouring frames' (the heart does not halve its volume
    in one frame) means that frame took another candidate, or lost the LV in a merge; the
    frame then takes the candidate that overlaps its neighbours' LV most. Returns the frames
    changed.
    """
    n = len(cavities)
    sizes = np.array([int(lv.sum()) for lv, _ in cavities], float)
    changed = []
    for t in range(n):
        prev, nxt = cavities[(t - 1) % n][0], cavities[(t + 1) % n][0]
        ref = 0.5 * (sizes[(t - 1) % n] + sizes[(t + 1) % n])
        if n < 3 or sizes[t] >= 0.6 * min(sizes[(t - 1) % n], sizes[(t + 1) % n]) or not cands[t]:
            continue
        near = ndi.binary_dilation(prev | nxt, np.ones((3, 3, 1), bool))
        overlap = [int((c & near).sum()) for c in cands[t]]
        i = int(np.argmax(overlap))
        if overlap[i] == 0:
            continue
        lv, rv = _cavities(cands[t], i, near, spacing, max_wall)
        if lv is not None and 0.6 * ref <= lv.sum() <= 1.6 * ref:
            cavities[t] = (fill_holes_2d(lv), rv)
            changed.append(t)
    return changed


def _myo_slice(img: np.ndarray, lv: np.ndarray, blocked: np.ndarray, band: tuple[float, float],
               spacing: tuple[float, float], max_wall: float) -> np.ndarray:
    """Myocardium of one slice by rays from the LV centre.

    Along each of ``_N_ANGLES`` rays the wall runs from the endocardium while the (smoothed)
    intensity stays in the myocardium band and no blood is hit; the epicardial radius per
    angle is then median-filtered over neighbouring angles (the wall is smooth, noise
    excursions are not) and rasterised.
    """
    if lv.sum() < 3:
        return np.zeros_like(lv)
    c = np.array(ndi.center_of_mass(lv))
    step = 0.5 * min(spacing)
    radii = np.arange(0.0, 60.0 + max_wall, step)
    ang = (np.arange(_N_ANGLES) + 0.5) * 2 * np.pi / _N_ANGLES - np.pi
    di, dj = np.cos(ang) / spacing[0], np.sin(ang) / spacing[1]
    ii = c[0] + radii[None, :] * di[:, None]
    jj = c[1] + radii[None, :] * dj[:, None]
    v = ndi.map_coordinates(img, [ii, jj], order=1, mode="nearest")
    in_lv = ndi.map_coordinates(lv.astype(np.float32), [ii, jj], order=1, mode="constant") > 0.5
    in_blood = ndi.map_coordinates(blocked.astype(np.float32), [ii, jj], order=1, mode="constant") > 0.5
    r_epi = np.zeros(_N_ANGLES)
    for a in range(_N_ANGLES):
        outside = np.flatnonzero(~in_lv[a])
        if outside.size == 0:
            continue
        k0 = outside[0]
        r_end = radii[k0] + max_wall
        r_pv = radii[k0] + 1.5 * max(spacing)  # blurred endocardial edge: partial volume allowed
        k = k0
        while (k + 1 < radii.size and radii[k + 1] <= r_end and not in_blood[a, k + 1]
               and (band[0] <= v[a, k + 1] <= band[1] or radii[k + 1] <= r_pv)):
            k += 1
        r_epi[a] = radii[k] + 0.5 * step
    r_epi = ndi.median_filter(r_epi, size=5, mode="wrap")
    gi, gj = np.meshgrid(np.arange(lv.shape[0]), np.arange(lv.shape[1]), indexing="ij")
    dx, dy = (gi - c[0]) * spacing[0], (gj - c[1]) * spacing[1]
    r, th = np.hypot(dx, dy), np.arctan2(dy, dx)
    pos = (th + np.pi) / (2 * np.pi) * _N_ANGLES - 0.5  # continuous bin index
    lim = np.interp(pos, np.arange(-1, _N_ANGLES + 1), np.r_[r_epi[-1], r_epi, r_epi[0]])
    return (r <= lim) & ~lv & ~blocked


def _wall_minima(img: np.ndarray, lv: np.ndarray, spacing: tuple[float, float]) -> np.ndarray:
    """Per ray from the LV centre (``_N_ANGLES``), the darkest (smoothed) intensity 0.5-2.5
    voxels beyond the endocardium: the wall's own level, clear of the blurred blood edge
    that a fixed ring 1-2 voxels out still sees (walls are 2-3 voxels thick at ~3 mm).
    NaN where the ray does not leave the cavity."""
    c = np.array(ndi.center_of_mass(lv))
    step = 0.5 * min(spacing)
    vox = max(spacing)
    radii = np.arange(0.0, 80.0, step)
    ang = (np.arange(_N_ANGLES) + 0.5) * 2 * np.pi / _N_ANGLES - np.pi
    ii = c[0] + radii[None, :] * (np.cos(ang) / spacing[0])[:, None]
    jj = c[1] + radii[None, :] * (np.sin(ang) / spacing[1])[:, None]
    v = ndi.map_coordinates(img, [ii, jj], order=1, mode="nearest")
    inside = ndi.map_coordinates(lv.astype(np.float32), [ii, jj], order=1, mode="constant") > 0.5
    out = np.full(_N_ANGLES, np.nan)
    for a in range(_N_ANGLES):
        k0 = np.flatnonzero(~inside[a])
        if k0.size == 0:
            continue
        win = (radii >= radii[k0[0]] + 0.5 * vox) & (radii <= radii[k0[0]] + 2.5 * vox)
        if win.any():
            out[a] = float(v[a, win].min())
    return out


def _all_wall_minima(data: np.ndarray, cavities: list[tuple[np.ndarray, np.ndarray]],
                     spacing: tuple[float, float, float]) -> dict[tuple[int, int], np.ndarray]:
    """``_wall_minima`` of every (frame, slice) with an LV cavity."""
    out = {}
    for t, (lv, _) in enumerate(cavities):
        for k in range(lv.shape[2]):
            if lv[..., k].sum() >= 3:
                out[(t, k)] = _wall_minima(data[..., k, t], lv[..., k], spacing[:2])
    return out


def _myo_level(minima: dict[tuple[int, int], np.ndarray]) -> float:
    """The myocardium level: median of the wall minima over every ray, slice and frame (a
    minority of rays meet lung or atrium)."""
    vals = np.concatenate(list(minima.values())) if minima else np.array([])
    vals = vals[np.isfinite(vals)]
    return float(np.median(vals)) if vals.size else float("nan")


def _label_frame(img: np.ndarray, lv: np.ndarray, rv: np.ndarray, mid: float, band: tuple[float, float],
                 spacing: tuple[float, float, float], max_wall: float) -> np.ndarray:
    bright = img > mid
    out = np.zeros(img.shape, np.uint8)
    for k in range(img.shape[2]):
        myo = _myo_slice(img[..., k], lv[..., k], bright[..., k], band, spacing[:2], max_wall)
        out[..., k][myo] = 2
    out[rv & (out == 0)] = 1
    out[lv] = 3
    return out


def _tissue_level(data: np.ndarray, heart: np.ndarray, myo: float, hi: float) -> float:
    """Median intensity of the tissue around the heart region (body) that is brighter than
    the myocardium and darker than blood/fat (``hi``).

    Counting only values above ``1.1 x myo`` keeps lung partial volume and myocardium out:
    with either in, the median fell below the myocardium level on some randomised cines and
    the myocardium band closed.
    """
    ring = ndi.binary_dilation(heart, np.ones((3, 3, 1), bool), iterations=4) & ~heart
    vals = data[np.broadcast_to(ring[..., None], data.shape)]
    vals = vals[(vals > 1.1 * myo) & (vals < hi)]
    return float(np.median(vals)) if vals.size >= 20 else 0.5 * (myo + hi)


def classical_labels(cine: Cine, max_wall_mm: float) -> tuple[np.ndarray, dict[str, Any]]:
    """RV/MYO/LV labels of every frame by the classical method (module docstring) and what it measured."""
    data = np.asarray(cine.data, np.float64)
    heart = _heart_region(data)
    if heart.sum() == 0:
        raise ToolError(ErrorCode.value_range, "no moving heart found in the cine (all frames identical?)",
                        arg="cine")
    blood, dark = _levels(data, heart)
    mid = 0.5 * (blood + dark)
    cands = [_candidates(data[..., t] > mid, heart) for t in range(data.shape[3])]
    empty = np.zeros(data.shape[:3], bool)
    cavities = []
    picks, core = _pick_lv(cands)
    for cs, i_lv in zip(cands, picks):
        lv, rv = _cavities(cs, i_lv, core, cine.spacing, max_wall_mm)
        cavities.append((empty, empty) if lv is None else (fill_holes_2d(lv), rv))
    repicked = _repick_lost_frames(cands, cavities, cine.spacing, max_wall_mm)
    gone, atrium, detached = atrium_in_cycle(np.stack([lv for lv, _ in cavities], axis=-1))
    for t, (lv, _) in enumerate(cavities):
        lv[:, :, gone[:, t]] = False
    # noise vs the small myocardium/body contrast: the wall is traced on a smoothed image
    smooth = ndi.gaussian_filter(data, sigma=(0.7, 0.7, 0.0, 0.0))
    minima = _all_wall_minima(smooth, cavities, cine.spacing)
    myo = _myo_level(minima)
    if not np.isfinite(myo):
        raise ToolError(ErrorCode.value_range, "no left-ventricular cavity found in the cine", arg="cine")
    body = _tissue_level(smooth, heart, myo, mid)
    # myocardium band: above half-way to the (dark) lung, below half-way to the body tissue
    band = (0.5 * myo, 0.5 * (myo + body))
    labels = np.stack([_label_frame(smooth[..., t], lv, rv, mid, band, cine.spacing, max_wall_mm)
                       for t, (lv, rv) in enumerate(cavities)], axis=-1)
    meta = {"method": "classical_cine", "blood_level": blood, "myo_level": myo, "tissue_level": body,
            "blood_threshold": mid, "myo_band": list(band), "heart_voxels": int(heart.sum()),
            "repicked_frames": repicked, "atrium_slices": atrium, "detached_slices": detached}
    return labels, meta


__all__ = ["classical_labels"]
