"""``seg.prostate``: prostate gland and zones (1 peripheral, 2 transition) on the T2w grid.

Methods (``method``):

- ``auto`` (default): the shipped network (``bcer/assets/bundles/prostate_unet3d``, a small
  3-D MONAI UNet trained by ``scripts/train_prostate_bundle.py`` on the domain-randomised
  phantom family only; see ``prostate_net``), which finds the gland anywhere in the field of
  view, on any obliquity and intensity scale; the classical method below when the network is
  not installed, cannot run, or finds no gland (``meta["fallback"]`` says why);
- ``network``: the shipped network only (an error when it cannot run);
- ``classical``: the T2w rules below.

With ``bundle_dir`` that local MONAI bundle runs instead (1 channel: T2w; 2 channels: T2w and
the ADC resampled onto the T2w grid; a bundle whose metadata names the canonical grid is fed
as ``prostate_net`` feeds the shipped one).

The classical T2w method learns every level from the case, and assumes the gland fills the
centre of the field of view (prostate protocols centre it; it fails when they do not):

1. the dominant tissue level (peri-prostatic fat) is the mode of the T2w histogram;
2. the transition zone level is the mode of the darker-than-fat voxels at the field-of-view
   centre (prostate protocols centre the gland), of their brighter class when a markedly
   T2-dark lesion fills the centre; the TZ is the component of its intensity
   band (above 3/4 of its level, below half-way to fat) that fills most of the centre,
   after a light opening that cuts thin bridges;
3. the peripheral zone is the T2-bright band (above half-way from fat to its own level,
   below the much brighter bladder/fluid) touching the transition zone;
4. gland = both, closed, hole-filled and made convex per slice (a T2-dark lesion at the
   capsule looks like the surrounding dark structures; the gland outline spans it);
   zones: TZ inside the gland, PZ the rest, where the TZ is the solid ellipsoid fitted to the
   band's border with brighter tissue (robust least squares on the quadric; the moment-based
   core fit when that border is too incomplete), so a T2-dark lesion stuck to the band or cut
   out of it does not move the PZ/TZ border (``tz_ellipsoid``).

A given ADC is resampled onto the T2w grid (world coordinates) and its median per zone is
reported in ``meta`` (an audit number; it is only as good as the ADC/T2w alignment: run
``register.*`` first when the series moved); it is required to be finite and 3-D.
"""
from __future__ import annotations

import logging
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import Field
from scipy import ndimage as ndi
from skimage.filters import threshold_otsu
from skimage.morphology import convex_hull_image

from ...contracts.artifacts import Image, Mask
from ...contracts.errors import ErrorCode, ToolError
from .._checks import require_volume
from ..methods import classical_card, seg_card
from .confidence import attach, confidence
from ..registry import tool
from ..resample import resample_to
from ._common import BundleParams, ball, fill_holes_2d

log = logging.getLogger(__name__)

ZONE_LABELS = {1: "PZ", 2: "TZ"}
_CONN = ndi.generate_binary_structure(3, 1)


class ProstateParams(BundleParams):
    method: Literal["auto", "network", "classical"] = Field(
        "auto", description="auto: shipped network, classical fallback; network: shipped network only; "
                            "classical: T2w intensity rules (gland at the field-of-view centre)")
    smooth_sigma_mm: float = Field(1.2, ge=0.0, le=5.0, description="in-plane Gaussian pre-smoothing (mm)")
    closing_mm: float = Field(3.0, ge=0.0, le=10.0, description="closing radius that seals the gland outline (mm)")
    convex: bool = Field(True, description="take the per-slice convex hull of the gland (the gland is convex)")
    tz_ellipsoid: bool = Field(True, description="zone the TZ as the robust solid ellipsoid fit of its intensity "
                                                 "band (T2-dark lesions stuck to or cut out of it do not move "
                                                 "the PZ/TZ border)")


class ProstateSeg(NamedTuple):
    gland: Mask
    zones: Mask


def _mode(values: np.ndarray, bins: int = 128) -> float:
    lo, hi = np.percentile(values, [1, 99])
    hist, edges = np.histogram(values, bins=bins, range=(lo, hi))
    hist = ndi.gaussian_filter1d(hist.astype(float), 1.5)
    i = int(np.argmax(hist))
    return float(0.5 * (edges[i] + edges[i + 1]))


def _central_component(mask: np.ndarray, centre: np.ndarray, spacing: tuple[float, ...],
                       radius_mm: float = 15.0) -> np.ndarray:
    """The component with most voxels within ``radius_mm`` of the centre: the gland fills
    the centre of a prostate field of view; a small lesion or the rectum only touches it."""
    lab, n = ndi.label(mask, _CONN)
    if n == 0:
        return mask
    idx = np.indices(mask.shape, dtype=np.float32)
    d = np.sqrt(sum(((idx[i] - centre[i]) * spacing[i]) ** 2 for i in range(3)))
    counts = np.bincount(lab[d <= radius_mm], minlength=n + 1)
    counts[0] = 0
    return lab == int(np.argmax(counts)) if counts.max() > 0 else np.zeros_like(mask)


def _convex_slices(mask: np.ndarray) -> np.ndarray:
    out = np.zeros_like(mask)
    for k in range(mask.shape[2]):
        if mask[..., k].sum() >= 3:
            out[..., k] = convex_hull_image(mask[..., k])
    return out


def _tz_level(central_dark: np.ndarray) -> float:
    """T2w level of the transition zone: the mode of the dark voxels at the gland centre, or of
    their brighter class when a markedly T2-dark lesion (< ~1/2 of the TZ signal) fills much
    of the centre and would otherwise pose as the TZ."""
    t = threshold_otsu(central_dark)
    lo, hi = central_dark[central_dark <= t], central_dark[central_dark > t]
    if hi.size >= max(50, 0.15 * central_dark.size) and lo.size and np.median(lo) < 0.7 * np.median(hi):
        return _mode(hi, bins=64)
    return _mode(central_dark, bins=64)


def _surface_fit(tz: np.ndarray, bright: np.ndarray, spacing: tuple[float, ...], keep: float = 0.8,
                 iters: int = 8) -> np.ndarray | None:
    """Solid ellipsoid through the TZ's border with brighter tissue (PZ, fat), or None.

    Only that border is trusted: where a T2-dark lesion sits in or against the TZ, the band's
    edge follows the lesion, not the zone, and is left out. Least squares on the quadric
    ``x^T A x + b^T x = 1`` (centred, mm), refitted on the ``keep`` best-fitting points so a
    bright-bordered lesion stuck to the TZ does not pull the surface.
    """
    # the voxel layers on both sides of the border: together they straddle it (one side alone
    # would shrink or grow the zone by half a voxel)
    outer = bright & ~tz
    edge = (tz & ndi.binary_dilation(outer, _CONN)) | (outer & ndi.binary_dilation(tz, _CONN))
    pts = np.argwhere(edge).astype(np.float64) * np.asarray(spacing[:3])
    if len(pts) < 30:
        return None
    mu = pts.mean(axis=0)
    x, y, z = (pts - mu).T
    design = np.c_[x * x, y * y, z * z, 2 * x * y, 2 * x * z, 2 * y * z, x, y, z]
    use = np.ones(len(pts), dtype=bool)
    for i in range(iters):
        coef, *_ = np.linalg.lstsq(design[use], np.ones(int(use.sum())), rcond=None)
        resid = np.abs(design @ coef - 1.0)
        # first a fixed share, then a robust scale: a large lesion's border can exceed any share
        med = float(np.median(resid[use]))
        cut = np.quantile(resid, keep) if i == 0 else med + 3.0 * 1.4826 * float(np.median(np.abs(resid[use] - med)))
        use = resid <= cut
    a = np.array([[coef[0], coef[3], coef[4]], [coef[3], coef[1], coef[5]], [coef[4], coef[5], coef[2]]])
    if np.any(np.linalg.eigvalsh(a) <= 0):  # not an ellipsoid: the border is too incomplete
        return None
    idx = np.indices(tz.shape, dtype=np.float64).reshape(3, -1).T * np.asarray(spacing[:3]) - mu
    val = np.einsum("ij,jk,ik->i", idx, a, idx) + idx @ coef[6:]
    return (val <= 1.0).reshape(tz.shape)


def _ellipsoid_fit(mask: np.ndarray, spacing: tuple[float, ...], core: float = 0.8,
                   iters: int = 8) -> np.ndarray:
    """The solid ellipsoid best fitting ``mask``, robust to blobs attached to or bitten out of it.

    A uniform solid ellipsoid has covariance ``C`` with its surface at Mahalanobis d^2 = 5; the
    voxels inside d^2 <= 5 core^2 are its scaled copy with covariance core^2 C. Refitting on that
    core a few times (a C-step, as in minimum covariance determinant) lets the dense body win
    over a T2-dark peripheral lesion stuck to the transition-zone band or a dark TZ lesion
    notched out of it.
    """
    pts = np.argwhere(mask).astype(np.float64) * np.asarray(spacing[:3])
    if len(pts) < 20:
        return mask
    keep = np.ones(len(pts), dtype=bool)
    scale = 1.0
    for _ in range(iters):
        mu, cov = pts[keep].mean(axis=0), np.cov(pts[keep].T) * scale
        if np.linalg.det(cov) <= 0:
            return mask
        icov = np.linalg.inv(cov)
        diff = pts - mu
        new = np.einsum("ij,jk,ik->i", diff, icov, diff) <= 5.0 * core ** 2
        if new.sum() < 20 or np.array_equal(new, keep):
            break
        keep, scale = new, 1.0 / core ** 2
    idx = np.indices(mask.shape, dtype=np.float64).reshape(3, -1).T * np.asarray(spacing[:3]) - mu
    return (np.einsum("ij,jk,ik->i", idx, icov, idx) <= 5.0).reshape(mask.shape)


def _classical(t2w: Image, p: ProstateParams) -> tuple[np.ndarray, dict[str, Any]]:
    raw = np.asarray(t2w.data, np.float64)
    sp = t2w.spacing
    sig = [p.smooth_sigma_mm / s if i < 2 else 0.0 for i, s in enumerate(sp)]
    img = ndi.gaussian_filter(raw, sig) if p.smooth_sigma_mm else raw
    fat = _mode(img[img > 0.05 * np.percentile(img, 99)])
    centre = (np.array(img.shape) - 1) / 2.0
    opener = ball(1.0 * max(sp[:2]), sp)
    # transition zone level: the mode of the darker-than-fat voxels filling the centre
    idx = np.indices(img.shape, dtype=np.float32)
    dist = np.sqrt(sum(((idx[i] - centre[i]) * sp[i]) ** 2 for i in range(3)))
    central_dark = img[(dist <= 15.0) & (img < 0.85 * fat)]
    if central_dark.size < 50:
        raise ToolError(ErrorCode.value_range, "no T2-dark central gland found in 't2w'",
                        hint="is the gland in the field of view centre?", arg="t2w")
    tz_level = _tz_level(central_dark)
    # TZ band: half-way to fat above; below, dark lesions, rectal wall and muscle (<= ~3/4
    # of the TZ level) are cut off so they cannot bridge the TZ to structures outside
    dark_lo, dark_thr = 0.75 * tz_level, 0.5 * (fat + tz_level)
    tz = _central_component(ndi.binary_opening((img > dark_lo) & (img < dark_thr), opener), centre, sp)
    tz = fill_holes_2d(ndi.binary_fill_holes(tz))
    # peripheral zone: bright band next to the TZ; its level from the TZ's bright surroundings
    shell = ndi.binary_dilation(tz, ball(6.0, sp)) & ~tz
    above = img[shell & (img > 1.05 * fat)]
    pz_level = float(np.median(above)) if above.size else 1.25 * fat
    bright_lo, bright_hi = 0.5 * (fat + pz_level), pz_level + 2.0 * (pz_level - fat)
    band = (img > bright_lo) & (img < bright_hi)
    lab, _ = ndi.label(band, _CONN)
    touch = np.unique(lab[ndi.binary_dilation(tz, _CONN, iterations=2) & band])
    pz = np.isin(lab, touch[touch > 0])
    gland = tz | pz
    if p.closing_mm:
        gland = ndi.binary_closing(gland, ball(p.closing_mm, sp)) | gland
    gland = _central_component(fill_holes_2d(ndi.binary_fill_holes(gland)), centre, sp)
    if p.convex:  # dark lesions at the capsule leave notches the convex gland outline spans
        gland = _convex_slices(gland)
    zones = np.where(gland, 1, 0).astype(np.int16)
    if p.tz_ellipsoid:
        fit = _surface_fit(tz, img > dark_thr, sp)
        tz = _ellipsoid_fit(tz, sp) if fit is None else fit
    zones[tz & gland] = 2
    meta = {"method": "classical_t2w", "fat_level": fat, "tz_level": tz_level, "pz_level": pz_level,
            "tz_band": [dark_lo, dark_thr], "bright_band": [bright_lo, bright_hi]}
    return zones, meta


def _bundle(t2w: Image, adc: Image | None, p: ProstateParams, device: str) -> tuple[np.ndarray, dict[str, Any]]:
    from .bundle import load_bundle, run_bundle
    from .bundle_labels import PROSTATE_ZONE_TARGETS, Channel

    bundle = load_bundle(p.bundle_dir, device)
    if str(bundle.meta.get("bcer", {}).get("grid", "")).startswith("canonical"):
        from .prostate_net import segment

        return segment(t2w, p.bundle_dir, device, p.overlap, p.sw_batch_size)
    # the bundle's channel_def picks by name; ADC is resampled onto T2w only when it is asked for
    offered = [Channel("T2w", "t2w", t2w.data),
               Channel("ADC", "adc", None if adc is None else (lambda: resample_to(adc, t2w)))]
    labels, meta = run_bundle(p.bundle_dir, offered, t2w.spacing, device, p.roi_size, p.sw_batch_size,
                              p.overlap, affine=t2w.affine, targets=PROSTATE_ZONE_TARGETS)
    return labels.astype(np.int16), meta


def _shipped(t2w: Image, p: ProstateParams, device: str) -> tuple[np.ndarray, dict[str, Any]]:
    """The shipped network; for ``auto``, the classical method when it cannot give a gland."""
    from .prostate_net import segment, shipped_prostate_bundle

    path = shipped_prostate_bundle()
    try:
        if path is None:
            raise ToolError(ErrorCode.input_missing, "the shipped prostate network is not installed",
                            hint="run scripts/train_prostate_bundle.py, or use method='classical'", arg="method")
        return segment(t2w, path, device, p.overlap, p.sw_batch_size)
    except (ToolError, ImportError) as e:
        if p.method == "network":
            raise
        log.warning("seg.prostate: network unavailable (%s); classical fallback", e)
        zones, meta = _classical(t2w, p)
        return zones, dict(meta, fallback=f"{type(e).__name__}: {e}")


CLASSICAL_CARD = classical_card("classical T2w levels (seg.prostate)", "1.4",
                               "fat/TZ/PZ levels from the T2w histogram, gland at the field-of-view centre")


@tool("seg.prostate", version="1.4", milestone="segmentation",
      resources={"num_cpus": 1, "memory_mb": 2048}, gpu="optional")
def prostate(t2w: Image, params: ProstateParams, adc: Image | None = None, device: str = "cpu") -> ProstateSeg:
    """Prostate gland and zones (1 PZ, 2 TZ) on the T2w grid.

    Args:
        t2w: axial T2-weighted volume.
        params: ``bundle_dir`` for a MONAI bundle (labels 0/1 PZ/2 TZ), else the classical method.
        adc: optional ADC map on its own grid (resampled through world coordinates).
        device: "cpu" or "cuda" (bundle inference only).

    Returns:
        ``gland`` (0/1) and ``zones`` (0/1 PZ/2 TZ) masks with the T2w affine.

    Raises:
        ToolError: ``shape`` unless 3-D, ``numeric`` for NaN/Inf, ``value_range`` when no
            central gland is found.
    """
    require_volume(t2w, "t2w")
    if adc is not None:
        require_volume(adc, "adc")
    if params.bundle_dir:
        zones, meta = _bundle(t2w, adc, params, device)
    elif params.method == "classical":
        zones, meta = _classical(t2w, params)
    else:
        zones, meta = _shipped(t2w, params, device)
    meta["method_card"] = seg_card(meta, CLASSICAL_CARD)
    parts, own = meta.pop("agreement", None), meta.pop("low_confidence_threshold", None)
    reason = "" if parts else f"no test-time reading of {meta.get('method')}"
    # the network's own threshold where its bundle states one (chosen on its development data)
    attach(meta, confidence("seg.prostate", parts, reason, threshold=own))
    vox = t2w.voxel_volume_ml
    meta.update(gland_ml=float(np.count_nonzero(zones) * vox), pz_ml=float(np.count_nonzero(zones == 1) * vox),
                tz_ml=float(np.count_nonzero(zones == 2) * vox))
    if adc is not None:
        adc_on_t2 = resample_to(adc, t2w)
        for k, name in ZONE_LABELS.items():
            sel = zones == k
            meta[f"{name.lower()}_median_adc"] = float(np.median(adc_on_t2[sel])) if sel.any() else None
    aff = np.asarray(t2w.affine, np.float64)
    return ProstateSeg(gland=Mask((zones > 0).astype(np.int16), aff.copy(), dict(meta), labels={1: "gland"}),
                       zones=Mask(zones, aff.copy(), dict(meta), labels=dict(ZONE_LABELS)))
