"""Per-zone references of ``detect.prostate_lesions``: each zone's normal ADC level, the
border band where the zone masks are uncertain, the ADC noise, and the within-zone smoothing.

PI-RADS v2.1 reads a lesion against the zone it sits in; these helpers estimate, on the ADC
grid, what "normal" is in each zone (robust to lesions that fill much of a zone) and what the
smoothed evidence a voxel is read on looks like. The rule that uses them is in ``detect``.
"""
from __future__ import annotations

import numpy as np
from scipy import ndimage
from skimage.filters import threshold_otsu

ZONE_NAMES = {1: "PZ", 2: "TZ"}

def _robust(v: np.ndarray) -> tuple[float, float]:
    med = float(np.median(v))
    return med, float(1.4826 * np.median(np.abs(v - med)))


def _normal_level(v: np.ndarray, sd: float) -> float:
    """Median ADC of a zone's normal tissue, robust to lesions filling much of the zone.

    Lesions only lower the ADC, so when a zone's values split (Otsu) into two classes more
    than 4 noise SDs apart (pure noise splits about 1.6 SDs apart), its normal tissue is the
    upper class; a lesion that fills most of the TZ otherwise drags the median down to the
    lesion's own ADC and the lesion is never a candidate. ``v`` holds the zone's interior only
    (``_interior``), so a brighter neighbouring zone leaking into the mask cannot pose as the
    upper class.
    """
    med = float(np.median(v))
    if v.size < 40 or float(v.max() - v.min()) <= 0.0:
        return med
    t = threshold_otsu(v)
    lo, hi = v[v <= t], v[v > t]
    # a few voxels of normal tissue may be all a lesion leaves of a small TZ on the coarse grid
    if hi.size >= max(10, v.size // 10) and lo.size and float(np.median(hi) - np.median(lo)) > 4.0 * sd:
        return float(np.median(hi))
    return med


def _zone_masks(gl: np.ndarray, zo: np.ndarray) -> dict[str, np.ndarray]:
    """The gland's zones on the ADC grid (PZ, TZ; voxels of the gland without a zone join the
    nearest zone); the whole gland as one reference when no zone has enough voxels."""
    zones = {ZONE_NAMES[z]: gl & (zo == z) for z in (1, 2) if np.count_nonzero(gl & (zo == z)) >= 20}
    if not zones:
        return {"gland": gl.copy()}
    lost = gl & ~np.logical_or.reduce(list(zones.values()))
    if lost.any():
        lab = np.zeros(gl.shape, np.int8)
        for k, sel in enumerate(zones.values(), start=1):
            lab[sel] = k
        idx = ndimage.distance_transform_edt(lab == 0, return_distances=False, return_indices=True)
        nearest = lab[tuple(idx)]
        for k, name in enumerate(list(zones), start=1):
            zones[name] |= lost & (nearest == k)
    return zones


def _interior(sel: np.ndarray, spacing: tuple[float, ...], depth_mm: float) -> np.ndarray:
    """Voxels at least ``depth_mm`` inside ``sel`` (border voxels mix tissues: fat, the other
    zone, mask and registration error), else one voxel inside, else all of ``sel``."""
    dist = ndimage.distance_transform_edt(sel, sampling=spacing)
    for cut in (depth_mm, 1.01 * min(spacing)):
        inner = sel & (dist > cut)
        if np.count_nonzero(inner) >= 40:
            return inner
    return sel


def _smooth_within(x: np.ndarray, support: np.ndarray, sigma_vox: np.ndarray, where: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian mean of ``x`` over the voxels of ``support`` only (normalised convolution),
    evaluated wherever ``where`` has support nearby (elsewhere ``x`` itself), and the support's
    weight there (1 deep inside the support, 0 far from it)."""
    if not np.any(sigma_vox > 0):
        return x.astype(np.float32), support.astype(np.float32)
    w = ndimage.gaussian_filter(support.astype(np.float32), sigma_vox, mode="constant")
    v = ndimage.gaussian_filter(np.where(support, x, 0.0).astype(np.float32), sigma_vox, mode="constant")
    return np.where(where & (w > 0.05), v / np.maximum(w, 1e-6), x).astype(np.float32), w


def _border_band(zones: dict[str, np.ndarray], spacing: tuple[float, ...], border_mm: float) -> np.ndarray:
    """Voxels of one zone within ``border_mm`` or one voxel (any direction: thick slices mix the
    zones through the slice) of the other zone; the zone masks are uncertain there."""
    band = np.zeros(next(iter(zones.values())).shape, bool)
    if len(zones) < 2:
        return band
    (_, s1), (_, s2) = zones.items()
    for mine, other in ((s1, s2), (s2, s1)):
        near = ndimage.binary_dilation(other, np.ones((3, 3, 3), bool))
        if border_mm > 0:
            near |= ndimage.distance_transform_edt(~other, sampling=spacing) <= border_mm
        band |= mine & near
    return band


def _reference(zones: dict[str, np.ndarray], levels: dict[str, float], band: np.ndarray) -> np.ndarray:
    """Each gland voxel's normal ADC: its own zone's level (PI-RADS reads a lesion against the
    zone it sits in), the lower of the zone levels in the border ``band``."""
    ref = np.full(band.shape, np.inf, np.float32)
    for name, sel in zones.items():
        ref[sel] = levels[name]
    ref[band] = min(levels.values())
    return ref


def _noise_sd(a: np.ndarray, inner: dict[str, np.ndarray]) -> float:
    """Native-grid ADC noise SD from differences of in-plane neighbours inside the zones
    (robust MAD / sqrt 2): differences cancel the tissue level, so a lesion or a mislabelled
    zone in the mask does not inflate the noise as a spread of values would."""
    diffs = []
    for m in inner.values():
        for ax in (0, 1):
            both = np.logical_and(np.take(m, range(1, m.shape[ax]), axis=ax), np.take(m, range(m.shape[ax] - 1), axis=ax))
            dv = np.diff(a, axis=ax)[both]
            if dv.size:
                diffs.append(dv)
    if not diffs:
        return min(_robust(a[m])[1] for m in inner.values())
    dv = np.concatenate(diffs)
    return float(1.4826 * np.median(np.abs(dv - np.median(dv))) / np.sqrt(2.0))


def _smoothed(a: np.ndarray, d: np.ndarray, frac: np.ndarray, zones: dict[str, np.ndarray],
              inner: dict[str, np.ndarray], band: np.ndarray, sigma: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Within-zone smoothed ADC and DWI, and the voxels with solid tissue around them.

    Smoothing averages over solid voxels of the zone only (wholly inside the gland, not
    DWI-dark; off the zone border band for voxels off it): a voxel half fat (ADC ~350) at the
    capsule has a lesion's ADC, a PZ voxel half TZ a mildly low one, and averaged in they would
    make normal tissue next to them look restricted. Other voxels take the average of their
    solid neighbours."""
    sa, sdw = a.astype(np.float32).copy(), d.astype(np.float32).copy()
    covered = np.zeros(a.shape, bool)
    for name, sel in zones.items():
        solid = sel & (frac >= 0.999) & (d >= 0.5 * float(np.median(d[inner[name]])))  # gas, bone, calcification
        # off the band: the band's mixed voxels stay out; in the band (read against the lower
        # zone level): the band's own voxels count, so a lesion lying in it stays visible
        for where, support in ((sel & ~band, solid & ~band), (sel & band, solid)):
            if np.count_nonzero(support) < 10:
                support = sel
            va, w = _smooth_within(a, support, sigma, where)
            sa[where], sdw[where] = va[where], _smooth_within(d, support, sigma, where)[0][where]
            covered |= where & (w >= 0.2)
    return sa, sdw, covered


def _references(a: np.ndarray, d: np.ndarray, zones: dict[str, np.ndarray], inner: dict[str, np.ndarray],
                band: np.ndarray, area: np.ndarray, spacing: tuple[float, ...], sd: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float]]:
    """Each search-area voxel's normal ADC, zone median DWI and the zone's normal-tissue DWI
    (a rim voxel takes those of the gland voxel nearest to it), and the zone levels.

    The normal-tissue DWI is the median over the zone's voxels at its normal ADC level (not
    more than 2 noise SDs below it): a lesion filling much of the TZ raises the zone's median
    DWI to its own, and against that median the lesion reads as no brighter than its zone."""
    levels = {name: _normal_level(a[m], sd) for name, m in inner.items()}
    ref = _reference(zones, levels, band)
    dref, dnorm = np.zeros(a.shape, np.float32), np.zeros(a.shape, np.float32)
    for name, sel in zones.items():
        dref[sel] = float(np.median(d[inner[name]]))
        normal = inner[name] & (a >= levels[name] - 2.0 * sd)
        dnorm[sel] = float(np.median(d[normal])) if np.count_nonzero(normal) >= 10 else dref[sel][0]
    gl = np.logical_or.reduce(list(zones.values()))
    rim = area & ~gl
    if rim.any():
        idx = tuple(ndimage.distance_transform_edt(~gl, sampling=spacing, return_distances=False, return_indices=True))
        ref[rim], dref[rim], dnorm[rim] = ref[idx][rim], dref[idx][rim], dnorm[idx][rim]
    ref[~area] = 0.0  # outside the search area nothing is below its reference
    return ref, dref, dnorm, levels
