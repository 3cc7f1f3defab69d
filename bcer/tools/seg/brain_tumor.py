"""``seg.brain_tumor``: BraTS labels (1 necrotic core, 2 oedema, 4 enhancing) from T1/T1c/T2/FLAIR.

With ``bundle_dir`` a local MONAI bundle does the work: its input channels in the order its
``channel_def`` names them (model-zoo BraTS: T1c, T1, T2, FLAIR; unnamed: t1, t1c, t2,
flair), its classes mapped by name to the BraTS labels (TC/WT/ET regions or per-class). Otherwise a classical multi-contrast method whose every threshold is learned
from the case itself:

0. bias: each contrast is divided by its N4 bias field (SimpleITK, fitted in its Otsu head
   mask at about 8 mm; ``bias_correction``), so a scanner's shading is not read as signal;
1. brain mask: the head is Otsu on the mean of the contrasts (each scaled by its 99th
   percentile), largest component, holes filled; on a head that was not skull-stripped the
   brain is the region inside the dark bone shell (``bcer.tools.skull``), so enhancing
   scalp is never taken for tumour;
2. each contrast is divided by its median inside the brain (normal tissue dominates, so
   the median is a normal-tissue reference, robust to the tumour and to scanner scale);
3. enhancing tumour (ET): T1c minus T1 (contrast uptake) beyond both a robust z of 4 and
   a 30 % signal rise, cut at half the candidates' median uptake; specks dropped;
4. whole tumour (WT): FLAIR hyperintensity (Otsu on the upper half of the brain's FLAIR),
   ET, and T2-bright/FLAIR-unsuppressed/T1c-dark necrosis touching ET; the component with
   most abnormal signal, and every other focus (multifocal tumours) of at least
   ``min_focus_ml`` whose abnormal signal is at least ``satellite_fraction`` of the main
   one's, holes filled;
5. tumour core (TC): with ET, the rim plus the T1c-dark class (Otsu, and below half the
   oedema's level) touching it, holes filled; without ET (low grade), the lower
   FLAIR+T1c Otsu class of the tumour's interior.
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
from scipy import ndimage as ndi
from pydantic import Field
from skimage.filters import threshold_otsu

from ...contracts.artifacts import Image, Mask
from ...contracts.errors import ErrorCode, ToolError
from .._checks import require_same_grid, require_volume
from ..methods import classical_card
from ..bias import N4Params, correct_bias
from ..registry import tool
from ..skull import Stripped, strip_skull
from .confidence import MIRROR_METHOD, attach, confidence, dice_by_label
from ._common import BundleParams, fill_holes_2d, largest_component

log = logging.getLogger(__name__)

BRATS_LABELS = {1: "necrotic_core", 2: "oedema", 4: "enhancing"}
_CONN = ndi.generate_binary_structure(3, 1)


class BrainTumorParams(BundleParams):
    smooth_sigma: float = Field(
        0.6, ge=0.0, le=3.0, description="Gaussian pre-smoothing in voxels (noise robustness)")
    min_et_fraction: float = Field(
        0.03, ge=0.0, le=0.5, description="ET smaller than this fraction of WT is treated as absent")
    min_focus_ml: float = Field(0.5, ge=0.0, le=50.0, description="a separate tumour focus is kept from this volume (mL)")
    satellite_fraction: float = Field(
        0.15, gt=0.0, le=1.0, description="and when its abnormal signal (FLAIR excess + enhancement) is at least this "
                                          "fraction of the main focus's (1: only the main focus)")
    bias_correction: bool = Field(True, description="N4-correct each contrast before its levels are learnt "
                                                    "(classical method; off: the contrasts as given)")


class BrainTumorSeg(NamedTuple):
    labels: Mask
    wt: Mask
    tc: Mask
    et: Mask


def _head_mask(stack: np.ndarray) -> np.ndarray:
    scaled = [c / max(float(np.percentile(c, 99)), 1e-6) for c in stack]
    mean = ndi.gaussian_filter(np.mean(scaled, axis=0), 1.0)
    brain = largest_component(mean > threshold_otsu(mean), _CONN)
    return fill_holes_2d(ndi.binary_fill_holes(brain))


def _upper_otsu(values: np.ndarray) -> float:
    """Otsu threshold of the values above the median: splits normal tissue from the bright tail."""
    upper = values[values > np.median(values)]
    return float(threshold_otsu(upper)) if upper.size > 1 and np.ptp(upper) > 0 else float(values.max())


def _enhancing(t1: np.ndarray, t1c: np.ndarray, brain: np.ndarray) -> tuple[np.ndarray, float]:
    """Contrast uptake: T1c - T1 (both relative to normal tissue) far above normal tissue.

    Candidates must exceed both a robust z-score of 4 and a 30 % relative signal increase
    (noise-free images have a tiny spread, so z alone flags trivial differences); the final
    cut is half the candidates' median uptake (half-maximum of the enhancing plateau).
    """
    diff = t1c - t1
    vals = diff[brain]
    med = float(np.median(vals))
    sd = 1.4826 * float(np.median(np.abs(vals - med)))
    floor = max(med + 4.0 * sd, med + 0.3)
    cand = brain & (diff > floor)
    thr = max(floor, med + 0.5 * (float(np.median(diff[cand])) - med)) if cand.any() else floor
    et = brain & (diff > thr)
    lab, n = ndi.label(et, _CONN)
    if n:  # isolated specks are noise; enhancing rims are connected structures
        sizes = ndi.sum(et, lab, index=np.arange(1, n + 1))
        et = np.isin(lab, 1 + np.flatnonzero(sizes >= 4))
    return et, thr


def _touching(cand: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Components of ``cand`` that touch ``seed`` (dilated by one voxel)."""
    lab, _ = ndi.label(cand, _CONN)
    keep = np.unique(lab[ndi.binary_dilation(seed, _CONN) & cand])
    return np.isin(lab, keep[keep > 0])


def _foci(lab: np.ndarray, n: int, excess: np.ndarray, others: list[np.ndarray],
          min_voxels: float, fraction: float) -> np.ndarray:
    """Component ids of the tumour: the one with the most abnormal signal, and every other one
    that is big enough, carries at least ``fraction`` of its signal and looks like it on the
    other contrasts (``others``, each normalised to normal tissue = 1): its median at least
    halfway from normal tissue to the main focus's, on the same side. A second tumour or a
    satellite passes; a FLAIR-only bright patch (an artefact, a bias field, a cortex fold)
    does not."""
    idx = np.arange(1, n + 1)
    sizes = np.bincount(lab.ravel(), minlength=n + 1)[1:]
    main = int(np.argmax(excess))
    keep = (sizes >= min_voxels) & (excess >= fraction * excess[main])
    for img in others:
        dev = np.asarray(ndi.median(img, lab, index=idx)) - 1.0
        keep &= dev * np.sign(dev[main]) >= 0.5 * abs(dev[main])
    keep[main] = True
    return 1 + np.flatnonzero(keep)


def _whole_tumour(flair: np.ndarray, t2: np.ndarray, t1c: np.ndarray, t1: np.ndarray, et: np.ndarray,
                  brain: np.ndarray, p: BrainTumorParams, vox_ml: float) -> tuple[np.ndarray, float]:
    thr = _upper_otsu(flair[brain])
    cand = brain & ((flair > thr) | et)
    cand = ndi.binary_opening(cand, _CONN) | et
    # Necrosis is T2-bright like CSF but neither FLAIR-suppressed nor T1c-grey (CSF/GM
    # partial volume is); it counts only where it touches the enhancing rim.
    if et.any():
        necro = brain & (t2 > _upper_otsu(t2[brain])) & (flair > 0.5 * thr) & (t1c < 0.5)
        cand |= _touching(necro, et)
    lab, n = ndi.label(cand, _CONN)
    if n == 0:
        return cand, thr
    # The tumour is the component with the largest abnormal-signal mass (not the largest
    # bright cortex fold): sum of FLAIR excess over the threshold.
    excess = ndi.sum(np.clip(flair - thr, 0, None) + 2.0 * et, lab, index=np.arange(1, n + 1))
    foci = _foci(lab, n, np.asarray(excess), [t2, t1], p.min_focus_ml / vox_ml, p.satellite_fraction)
    wt = np.isin(lab, foci)
    wt = fill_holes_2d(ndi.binary_fill_holes(wt))
    return wt & brain, thr


def _core(wt: np.ndarray, et: np.ndarray, flair: np.ndarray, t1c: np.ndarray, has_et: bool) -> np.ndarray:
    if has_et:
        # Necrosis is the T1c-dark class of the non-enhancing tumour (Otsu against oedema),
        # kept where it touches the enhancing rim; then the rim's enclosed interior.
        # Otsu alone would split a necrosis-free oedema in two: the dark class must also be
        # well below the oedema's level (half its median).
        rest = wt & ~et
        thr = 0.0
        if rest.sum() > 10:
            thr = min(float(threshold_otsu(t1c[rest])), 0.5 * float(np.median(t1c[rest])))
        dark = _touching(rest & (t1c < thr), et)
        return fill_holes_2d(ndi.binary_fill_holes(et | dark)) & wt
    # Low grade: the non-enhancing core is FLAIR/T1c-darker than the oedema around it; the
    # outer shell (partial volume with normal tissue) is left out of the split.
    interior = wt & ndi.binary_erosion(wt, _CONN)
    if interior.sum() < 10:
        return np.zeros_like(wt)
    score = flair / np.median(flair[wt]) + t1c / np.median(t1c[wt])
    thr = float(threshold_otsu(score[interior]))
    core = largest_component(ndi.binary_opening(interior & (score < thr), _CONN), _CONN)
    return fill_holes_2d(ndi.binary_fill_holes(core))


def _brain(t1: Image, t1c: Image, t2: Image, flair: Image, bias: bool = True) -> tuple[np.ndarray, Stripped]:
    """The four contrasts stacked (each N4-corrected with ``bias``), and the brain found in
    them (independent of the smoothing, so the rerun at 1.5x smoothing reuses it)."""
    raw = np.stack([_unshaded(x) if bias else np.asarray(x.data, np.float64) for x in (t1, t1c, t2, flair)])
    return raw, strip_skull(raw, _head_mask(raw))


N4_FIT_MM = 8.0  # N4 fits its field on a copy at about this voxel size: the field is smooth over centimetres


def _unshaded(img: Image) -> np.ndarray:
    """One contrast divided by its N4 bias field (Otsu head mask). The levels below are learnt
    from the whole brain; a scanner's shading (receive coils: a factor of 2 across a head is
    common) otherwise lifts normal tissue on one side over the FLAIR threshold, as oedema."""
    shrink = tuple(max(1, int(round(N4_FIT_MM / s))) for s in img.spacing)
    data = np.asarray(img.data, np.float64)
    if not np.any(data > 0):
        return data
    out, _ = correct_bias(data, img.affine, N4Params(), shrink=shrink)
    return out.astype(np.float64)


def _classical(t1: Image, t1c: Image, t2: Image, flair: Image, p: BrainTumorParams,
               found: tuple[np.ndarray, Stripped] | None = None) -> tuple[np.ndarray, dict]:
    raw, strip = found or _brain(t1, t1c, t2, flair)
    brain = strip.brain
    if brain.sum() < 100:
        raise ToolError(ErrorCode.value_range, "no brain found: the contrasts are (nearly) empty",
                        arg="t1")
    ref = [max(float(np.median(c[brain])), 1e-6) for c in raw]
    # The enhancing rim is 1-2 voxels thick: it is found unsmoothed; the large oedema and
    # core regions are found on lightly smoothed images (noise robustness).
    r1, r1c = raw[0] / ref[0], raw[1] / ref[1]
    sm = [ndi.gaussian_filter(c, p.smooth_sigma) / r if p.smooth_sigma else c / r for c, r in zip(raw, ref)]
    et, et_thr = _enhancing(r1, r1c, brain)
    wt, fl_thr = _whole_tumour(sm[3], sm[2], sm[1], sm[0], et, brain, p, t1.voxel_volume_ml)
    n1c, nfl = sm[1], sm[3]
    et &= wt
    has_et = bool(et.sum() >= max(p.min_et_fraction * wt.sum(), 3))
    if not has_et:
        et[:] = False
    tc = _core(wt, et, nfl, n1c, has_et) | et
    labels = np.zeros(wt.shape, np.int16)
    labels[wt] = 2
    labels[tc] = 1
    labels[et] = 4
    meta = {"method": "classical_multicontrast", "flair_threshold_rel": fl_thr,
            "enhancement_threshold_rel": et_thr, "enhancing_present": has_et,
            "brain_voxels": int(brain.sum()), **strip.record()}
    if strip.scalp_left_in:  # a person must see that scalp may have been taken for tumour
        meta["flags"] = {"skull_not_removed": {"flagged": True, "detail": f"{strip.reason}: enhancing or FLAIR-bright "
                                               "scalp may be labelled as tumour; skull-strip the input first"}}
    return labels, meta


def _rerun_agreement(labels: np.ndarray, t1: Image, t1c: Image, t2: Image, flair: Image,
                     p: BrainTumorParams, found: tuple[np.ndarray, Stripped]) -> dict[str, float] | None:
    """Self-consistency of the classical labels: WT/TC/ET Dice against a rerun at 1.5x the
    smoothing on the same brain (None when the rerun finds no brain)."""
    try:
        again, _ = _classical(t1, t1c, t2, flair, p.model_copy(update={"smooth_sigma": 1.5 * p.smooth_sigma or 0.5}),
                              found)
    except ToolError:
        return None
    return dice_by_label(labels, again, {"WT": (1, 2, 4), "TC": (1, 4), "ET": (4,)})


def _bundle(t1: Image, t1c: Image, t2: Image, flair: Image, params: BrainTumorParams,
            device: str) -> tuple[np.ndarray, dict, dict]:
    """Labels from a MONAI bundle, its audit meta, and its confidence: the same bundle on the
    four contrasts mirrored along the first voxel axis (affine unchanged, so the network sees
    a mirrored head, a real second reading even for a bundle that reorients its input),
    mirrored back; threshold from the bundle's metadata (``bcer.low_confidence_threshold``)."""
    from .bundle import run_bundle
    from .bundle_labels import BRATS_TARGETS, Channel

    def run(flip: bool) -> tuple[np.ndarray, dict]:
        # offered in bcer's order; the bundle's channel_def picks its own (BraTS bundles: T1c first)
        offered = [Channel(seq, port, np.flip(img.data, 0) if flip else img.data) for seq, port, img in
                   (("T1", "t1", t1), ("T1c", "t1c", t1c), ("T2", "t2", t2), ("FLAIR", "flair", flair))]
        lab, meta = run_bundle(params.bundle_dir, offered, t1.spacing, device, params.roi_size,
                               params.sw_batch_size, params.overlap, affine=t1.affine, targets=BRATS_TARGETS)
        return (np.flip(lab, 0) if flip else lab).astype(np.int16), meta

    labels, meta = run(False)
    mirrored, _ = run(True)
    parts = dice_by_label(labels, mirrored, {"WT": (1, 2, 4), "TC": (1, 4), "ET": (4,)})
    threshold = meta.get("low_confidence_threshold")  # run_bundle passes on the bundle's own
    conf = confidence("seg.brain_tumor", parts, "" if threshold is not None else
                      "the bundle states no bcer.low_confidence_threshold for its mirror agreement",
                      threshold=None if threshold is None else float(threshold), method=MIRROR_METHOD)
    return labels, meta, conf


CLASSICAL_CARD = classical_card("classical multicontrast thresholds (seg.brain_tumor)", "1.4",
                               "N4 bias correction, brain inside the bone shell, enhancement and FLAIR/T2 "
                               "thresholds learnt per case, core by filling")


@tool("seg.brain_tumor", version="1.4", milestone="segmentation",
      resources={"num_cpus": 1, "memory_mb": 2048}, gpu="optional")
def brain_tumor(t1: Image, t1c: Image, t2: Image, flair: Image, params: BrainTumorParams,
                device: str = "cpu") -> BrainTumorSeg:
    """Brain tumour labels (BraTS 1/2/4) and WT/TC/ET masks from four co-registered contrasts.

    Args:
        t1, t1c, t2, flair: the four contrasts on one voxel grid (register/resample first).
        params: ``bundle_dir`` for a MONAI bundle (channels as its channel_def names them), else the
            classical method with its smoothing and ET-presence settings.
        device: "cpu" or "cuda" (bundle inference only).

    Returns:
        ``labels`` (0/1/2/4), ``wt`` (1+2+4), ``tc`` (1+4), ``et`` (4) on the input grid.

    Raises:
        ToolError: ``shape`` for non-3-D inputs or different grids, ``numeric`` for NaN/Inf.
    """
    for name, img in (("t1", t1), ("t1c", t1c), ("t2", t2), ("flair", flair)):
        require_volume(img, name)
        if name != "t1":
            require_same_grid(t1, img, "t1", name)
    if params.bundle_dir:
        labels, meta, conf = _bundle(t1, t1c, t2, flair, params, device)
    else:
        found = _brain(t1, t1c, t2, flair, params.bias_correction)
        labels, meta = _classical(t1, t1c, t2, flair, params, found)
        meta["method_card"] = CLASSICAL_CARD.model_dump(exclude_defaults=True)
        parts = _rerun_agreement(labels, t1, t1c, t2, flair, params, found)
        conf = confidence("seg.brain_tumor", parts, "" if parts else "the rerun found no brain")
    attach(meta, conf)
    vox = t1.voxel_volume_ml
    meta.update({f"{k}_ml": float(np.count_nonzero(labels == v) * vox) for k, v in
                 (("necrotic", 1), ("oedema", 2), ("enhancing", 4))})
    aff = np.asarray(t1.affine, np.float64).copy()

    def mk(data: np.ndarray, names: dict[int, str]) -> Mask:
        return Mask(data.astype(np.int16), aff.copy(), dict(meta), labels=names)

    return BrainTumorSeg(labels=mk(labels, dict(BRATS_LABELS)), wt=mk(labels > 0, {1: "WT"}),
                         tc=mk((labels == 1) | (labels == 4), {1: "TC"}), et=mk(labels == 4, {1: "ET"}))
