"""Checks that decide whether ``seg.cardiac``'s ``auto`` keeps the network's walls or falls
back to the classical labels, and the flag on delivered labels that break physiology.

Each check asks something the anatomy or the image settles, not a score on a phantom family:
a beating heart (:func:`network_problem`), an incompressible muscle
(:func:`myocardium_problem`), and an outer wall border that lies on an edge of the image
(:func:`wall_edge_problem`); :func:`wall_problem` asks the last two.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import ndimage

# Myocardial volume is nearly constant over the cycle (the muscle is incompressible; CMR mass
# at ED and ES agrees within a few per cent). A reading whose smallest frame has under 75 %
# of its largest frame's myocardium is not a myocardium: it is a wall drawn at a fixed
# thickness while the real wall thickens (the network's reading of hypertrophic and dilated
# hearts outside its training family, docs/segmenters.md).
MIN_MYO_VOLUME_RATIO = 0.75
# A wall border is where the image changes: muscle meets fat, lung or liver. An outer border
# drawn inside the muscle (a thick wall drawn thin) lies on flat muscle, so its image edge is
# a fraction of the one a border on the true epicardium finds. Under half is the call.
MIN_EPICARDIAL_EDGE_RATIO = 0.5
_MIN_MYO_PIXELS = 20  # a slice's myocardium smaller than this has no outer border worth reading


def network_problem(labels: np.ndarray) -> str | None:
    """Why a network's label cine is not a beating heart (None when it is): an LV in every
    frame across at least two slices, and a volume curve that changes (EF 3-95 %) without more
    than a quarter of the frames jumping away from both neighbours; an RV in every frame with
    an RV EF of 3-90 %."""
    from ..cardiac import outlier_frames

    lv = np.count_nonzero(labels == 3, axis=(0, 1, 2)).astype(float)
    slices = np.count_nonzero((labels == 3).any(axis=(0, 1)), axis=0)
    if (lv < 10).any():
        return f"no LV in frame(s) {np.flatnonzero(lv < 10).tolist()}"
    if (slices < 2).any():
        return f"LV in fewer than two slices in frame(s) {np.flatnonzero(slices < 2).tolist()}"
    ef = 100.0 * (lv.max() - lv.min()) / lv.max()
    if not 3.0 <= ef <= 95.0:
        return f"LV volume curve implausible (EF {ef:.1f} %)"
    jumps = outlier_frames(lv)
    if lv.size >= 8 and jumps.sum() >= 2:
        return f"LV volume jumps in frames {np.flatnonzero(jumps).tolist()}"
    # the hybrid takes the network's RV as is: an RV that vanishes in a frame gives an RV EF
    # of ~100 % (seen on a base-family cine, caught by the ef_range plausibility check)
    rv = np.count_nonzero(labels == 1, axis=(0, 1, 2)).astype(float)
    if (rv < 10).any():
        return f"no RV in frame(s) {np.flatnonzero(rv < 10).tolist()}"
    rv_ef = 100.0 * (rv.max() - rv.min()) / rv.max()
    if not 3.0 <= rv_ef <= 90.0:
        return f"RV volume curve implausible (EF {rv_ef:.1f} %)"
    return None


def myo_volume_ratio(labels: np.ndarray) -> float:
    """Smallest over largest myocardial volume (label 2) over the frames of a label cine; NaN
    without myocardium."""
    from ..cardiac import volume_curves

    v = volume_curves(labels, 1.0)["myo"].astype(float)
    return float(v.min() / v.max()) if v.max() > 0 else float("nan")


def myocardium_problem(network: np.ndarray, classical: np.ndarray, min_ratio: float) -> str | None:
    """Why the network's myocardium should give way to the classical one (None when it should
    not): it loses more than ``1 - min_ratio`` of its volume over the cycle while the classical
    myocardium keeps within that bound. When both break it, the network's stands (the
    classical reading is then no better founded)."""
    net, cla = myo_volume_ratio(network), myo_volume_ratio(classical)
    if not (np.isfinite(net) and np.isfinite(cla) and net < min_ratio <= cla):
        return None
    return (f"the network's myocardium changes volume over the cycle (smallest frame {100 * net:.0f} % of the "
            f"largest, limit {100 * min_ratio:g} %; classical {100 * cla:.0f} %): the muscle is incompressible")


def flag_unconserved_myocardium(labels: np.ndarray, min_ratio: float, meta: dict[str, Any]) -> None:
    """Flag delivered labels whose myocardium loses more than ``1 - min_ratio`` of its volume
    over the cycle (no reading kept it, or the caller chose the method): the wall thickness,
    mass and regional thickening read from them need a look."""
    ratio = myo_volume_ratio(labels)
    if min_ratio > 0 and np.isfinite(ratio) and ratio < min_ratio:
        meta.setdefault("flags", {})["myocardium_not_conserved"] = {
            "flagged": True, "value": round(ratio, 3), "threshold": min_ratio,
            "detail": f"the myocardium's smallest frame holds {100 * ratio:.0f} % of its largest (heart muscle keeps "
                      f"its volume over the cycle; limit {100 * min_ratio:g} %): wall thickness and mass need a look"}


def epicardial_edge(data: np.ndarray, labels: np.ndarray) -> float:
    """Median image edge strength on the outer border of the left heart (LV cavity and
    myocardium) off the RV, over every slice and frame with a myocardium; NaN without one.

    Edge strength is the Sobel gradient magnitude of the frame smoothed by 0.7 pixel. The
    border next to the RV is left out: the septum's far side meets the RV blood, where any
    reading of the wall finds an edge."""
    vals = []
    for z in range(labels.shape[2]):
        for t in range(labels.shape[3]):
            lab = labels[:, :, z, t]
            if np.count_nonzero(lab == 2) < _MIN_MYO_PIXELS:
                continue
            img = ndimage.gaussian_filter(np.asarray(data[:, :, z, t], np.float64), 0.7)
            grad = np.hypot(ndimage.sobel(img, 0), ndimage.sobel(img, 1))
            heart = (lab == 2) | (lab == 3)
            border = heart & ~ndimage.binary_erosion(heart) & ~ndimage.binary_dilation(lab == 1)
            vals.append(grad[border])
    v = np.concatenate(vals) if vals else np.zeros(0)
    return float(np.median(v)) if v.size else float("nan")


def wall_edge_problem(data: np.ndarray, network: np.ndarray, classical: np.ndarray, min_ratio: float) -> str | None:
    """Why the network's outer wall border should give way to the classical one (None when
    it should not): it lies on under ``min_ratio`` of the image edge the classical border lies
    on, so it runs through the muscle instead of along its surface (a thick wall drawn thin).
    ``network`` is the label cine whose myocardium is read (the hybrid's); 0 turns it off."""
    if min_ratio <= 0:
        return None
    net, cla = epicardial_edge(data, network), epicardial_edge(data, classical)
    if not (np.isfinite(net) and np.isfinite(cla) and cla > 0 and net < min_ratio * cla):
        return None
    return (f"the network's outer wall border lies on {100 * net / cla:.0f} % of the image edge the classical "
            f"border lies on (limit {100 * min_ratio:g} %): it runs through the muscle, the wall is thicker")


def wall_problem(data: np.ndarray, network: np.ndarray, merged: np.ndarray, classical: np.ndarray,
                 min_myo_ratio: float, min_edge_ratio: float) -> str | None:
    """Why the hybrid's wall should give way to the classical labels (None when it should
    not): the network's myocardium is not conserved (:func:`myocardium_problem`), or the
    merged labels' outer border lies on flat muscle (:func:`wall_edge_problem`)."""
    return (myocardium_problem(network, classical, min_myo_ratio)
            or wall_edge_problem(data, merged, classical, min_edge_ratio))

