"""``seg.cardiac``: RV (1), MYO (2), LV (3) on every frame of a short-axis cine.

Methods (``method``):

* **auto** (default) = **hybrid**: the LV cavity of the classical method (below) with the
  myocardium and RV of the shipped network (:func:`merge_hybrid`). Chosen on the randomised
  family (20 cines, seeds 1000-1019): the network alone segments the myocardium and RV
  better (Dice 0.88/0.90 vs 0.82/0.84) but its LV cavity is biased over the cycle (EF error
  4.7 points mean, 17 max, vs 1.9/5.3 classical); the hybrid keeps the classical EF and
  ED/ES and the network's walls (ACDC group accuracy 0.90 vs 0.85 classical, 0.80 network).
  A frame where the merge loses the LV takes the network's labels (:func:`restore_lost_frames`,
  ``meta["network_frames"]``). ``auto`` checks the network's labels (:func:`network_problem`:
  an LV in every frame over two slices, a volume curve that beats and does not jump), then
  the merged labels (:func:`wall_problem`: a myocardium that keeps at least 75 % of its
  volume in every frame, unless the classical one does not either; an outer wall border on
  at least half the image edge the classical border finds), and uses the classical labels
  alone, saying why in ``meta["fallback"]``, when a check fails or the network cannot run
  (:mod:`.cardiac_checks`).
* **network**: the shipped ``cardiac_unet2d`` bundle, a 2-D MONAI UNet trained on the
  randomised phantom family by ``scripts/train_bundle.py``, on the frame and its slice's
  temporal std (:mod:`.cardiac_net`); every slice of every frame is one 2-D batch; the
  labels are then tidied into one heart over the cycle, without the left atrium above the
  base (:func:`.cardiac_net.tidy_labels`, :mod:`.cardiac_atrium`).
  ``bundle_dir`` runs another bundle the same way (with ``method="hybrid"``: merged).
* **classical**: intensity levels from the cine (:mod:`.cardiac_classical`, which says how and
  where it falls short).
"""
from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ...contracts.artifacts import Cine, Mask
from ...contracts.errors import ToolError
from .._checks import require_volume
from ..methods import MethodCard, classical_card, hybrid_card, seg_card
from ..registry import tool
from ._common import BundleParams
from .cardiac_checks import (MIN_EPICARDIAL_EDGE_RATIO, MIN_MYO_VOLUME_RATIO, flag_unconserved_myocardium,
                             network_problem, wall_problem)
from .cardiac_classical import classical_labels
from .confidence import attach, confidence, dice_by_label

log = logging.getLogger(__name__)

CARDIAC_LABELS = {1: "RV", 2: "MYO", 3: "LV"}
HYBRID = "hybrid_classical_lv_network_myo_rv"
GROUPS = {"LV": (3,), "MYO": (2,), "RV": (1,)}  # self-consistency: each structure's Dice between the methods
VETO = 0.25


class CardiacParams(BundleParams):
    max_wall_mm: float = Field(30.0, ge=5.0, le=60.0, description="largest myocardial wall thickness searched (mm)")
    min_myo_volume_ratio: float = Field(
        MIN_MYO_VOLUME_RATIO, ge=0.0, le=1.0,
        description="auto: the network's myocardium must keep at least this fraction of its largest volume in "
                    "every frame (the myocardium is incompressible), else the classical labels stand in when "
                    "their myocardium keeps that much; delivered labels below it are flagged; 0 turns both off")
    min_epicardial_edge_ratio: float = Field(
        MIN_EPICARDIAL_EDGE_RATIO, ge=0.0, le=1.0,
        description="auto: the hybrid's outer wall border must lie on at least this fraction of the image edge "
                    "(gradient) the classical border lies on, else the classical labels stand in (a border on "
                    "flat muscle is a thick wall drawn thin); 0 turns it off")
    method: Literal["auto", "network", "classical", "hybrid"] = Field(
        "auto", description="auto: hybrid with the shipped cardiac_unet2d network (classical LV cavity, the "
                            "network's myocardium and RV), the classical labels alone when the network is "
                            "unavailable or fails its checks; bundle_dir (without hybrid): that network only; "
                            "network: a network only (errors are raised); hybrid: classical LV + network "
                            "MYO/RV (errors are raised); classical: no network")


def _network(cine: Cine, data: np.ndarray, p: CardiacParams, device: str, bundle_dir: str
             ) -> tuple[np.ndarray, dict[str, Any]]:
    """Labels of a 2-D (or 3-D) bundle on every frame, tidied into one heart over the cycle."""
    from .bundle import run_bundle
    from .bundle_labels import CARDIAC_TARGETS
    from nibabel import orientations as nib_ornt

    from .cardiac_net import channels, inplane_ornt, inverse_ornt, tidy_labels

    ornt = inplane_ornt(cine.affine)
    canon = nib_ornt.apply_orientation(data, ornt)  # the same heart whatever the voxel order
    affine = cine.affine @ nib_ornt.inv_ornt_aff(ornt, data.shape[:3])
    spacing = tuple(float(v) for v in np.sqrt((affine[:3, :3] ** 2).sum(axis=0)))
    x, y, z, t = canon.shape
    labels, meta = run_bundle(bundle_dir, channels(canon), spacing, device, p.roi_size, p.sw_batch_size,
                              p.overlap, affine=affine, targets=CARDIAC_TARGETS)
    labels, tidy = tidy_labels(labels.reshape(x, y, z, t))
    meta["tidy"] = tidy
    meta["inplane_ornt"] = ornt.astype(int).tolist()
    return nib_ornt.apply_orientation(labels, inverse_ornt(ornt)), meta


def merge_hybrid(classical: np.ndarray, network: np.ndarray) -> np.ndarray:
    """LV cavity from the classical labels, myocardium and RV from the network's.

    Where the network calls LV what the classical blood threshold does not, on a slice and
    frame where the classical LV exists, the voxel is the blurred endocardial edge and joins
    the myocardium; on slices without a classical LV (an atrium it dropped, the apical cap)
    the network's LV is dropped. A slice and frame where the network's LV is under ``VETO``
    of the classical LV's area loses its classical LV (an atrium above the base).
    """
    out = np.zeros(classical.shape, np.int16)
    out[network == 1] = 1
    out[network == 2] = 2
    lv = classical == 3
    # a slice and frame where the network sees almost none of the classical LV is an atrium
    # the blood threshold took for ventricle (the network was trained with atria present)
    area_c = lv.sum(axis=(0, 1), keepdims=True)
    area_n = (network == 3).sum(axis=(0, 1), keepdims=True)
    lv &= ~(area_n < VETO * area_c)
    has_lv = lv.any(axis=(0, 1), keepdims=True)
    out[(network == 3) & ~lv & has_lv] = 2
    out[lv] = 3
    return out


LOST = 0.6  # a merged frame whose LV is under this fraction of the network's lost the classical LV


def restore_lost_frames(merged: np.ndarray, network: np.ndarray) -> list[int]:
    """Frames where the merge lost the LV take the network's labels (in place); returns them.

    On a frame where the classical method picked the wrong blood pool (a third of the
    cavity, between two frames of normal size), the network sees almost none of that LV on
    any slice, so ``merge_hybrid``'s atrium veto removes it everywhere and the frame keeps
    no LV at all (seen on 3 of 120 randomised cines, seeds 6033, 6039 and 7039, and on a
    ``bcer data synth`` cohort: an empty frame in the delivered labels). The network's own
    frame, which passed :func:`network_problem` with the rest of its cycle, stands in whole."""
    lv_m = np.count_nonzero(merged == 3, axis=(0, 1, 2))
    lv_n = np.count_nonzero(network == 3, axis=(0, 1, 2))
    lost = np.flatnonzero((lv_n > 0) & (lv_m < LOST * lv_n))
    for t in lost:
        merged[..., t] = network[..., t]
    return [int(t) for t in lost]


def _merge(classical: np.ndarray, network: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    out = merge_hybrid(classical, network)
    if lost := restore_lost_frames(out, network):
        log.info("seg.cardiac: the merge lost the LV in frame(s) %s; the network's labels stand in", lost)
        meta["network_frames"] = lost
    return out


def _hybrid(cine: Cine, data: np.ndarray, params: CardiacParams, device: str) -> tuple[np.ndarray, dict[str, Any]]:
    """``merge_hybrid`` of the classical labels and the network's (``bundle_dir`` or the shipped
    one); network errors are raised."""
    from .bundle import shipped_bundle

    labels, meta = classical_labels(cine, params.max_wall_mm)
    net, net_meta = _network(cine, data, params, device, params.bundle_dir or str(shipped_bundle()))
    meta = {**meta, "method": HYBRID, "network": net_meta, "agreement": dice_by_label(labels, net, GROUPS)}
    merged = _merge(labels, net, meta)
    if problem := network_problem(net) or _wall_problem(data, net, merged, labels, params):
        meta["check"] = problem
    return merged, meta


def _wall_problem(data: np.ndarray, net: np.ndarray, merged: np.ndarray, labels: np.ndarray,
                  params: CardiacParams) -> str | None:
    return wall_problem(data, net, merged, labels, params.min_myo_volume_ratio, params.min_epicardial_edge_ratio)


def _auto(cine: Cine, data: np.ndarray, params: CardiacParams, device: str) -> tuple[np.ndarray, dict[str, Any]]:
    """The hybrid (classical LV, the shipped network's myocardium and RV), or the classical
    method alone when the network is unavailable, fails, or its labels fail the checks."""
    from .bundle import shipped_bundle

    labels, meta = classical_labels(cine, params.max_wall_mm)
    try:
        net, net_meta = _network(cine, data, params, device, str(shipped_bundle()))
        problem = network_problem(net)
    except ImportError as e:  # torch/monai are not installed here
        problem = f"network unavailable: {e}"
    except ToolError as e:
        problem = f"network failed: {e.code.value}: {e.message}"
    if problem is None:
        hybrid = {**meta, "method": HYBRID, "network": net_meta, "agreement": dice_by_label(labels, net, GROUPS)}
        merged = _merge(labels, net, hybrid)
        problem = _wall_problem(data, net, merged, labels, params)
        if problem is None:
            return merged, hybrid
    log.warning("seg.cardiac: %s; classical method used alone", problem)
    meta["fallback"] = {"from": "network", "reason": problem}
    return labels, meta


# 2.10: auto falls back to the classical labels when the hybrid's outer wall border lies on flat muscle;
# 2.9: ... when the network's myocardium is not conserved
VERSION = "2.10"
CLASSICAL_CARD = classical_card("classical cine levels (seg.cardiac)", VERSION,
                               "blood/myocardium levels from the cine, LV/RV cavities by shape and motion")


def _no_second_reading(meta: dict[str, Any]) -> str:
    if "agreement" in meta:
        return ""
    fb = meta.get("fallback")
    return f"classical method alone: {fb['reason']}" if isinstance(fb, dict) else "classical method chosen alone"


def _card(meta: dict[str, Any]) -> dict[str, Any]:
    """Method card of the labels: hybrid (classical LV + network MYO/RV), network or classical."""
    if isinstance(meta.get("network"), dict):
        net = MethodCard(**seg_card(meta["network"], CLASSICAL_CARD))
        return hybrid_card(HYBRID, VERSION, [CLASSICAL_CARD, net]).model_dump(exclude_defaults=True)
    return seg_card(meta, CLASSICAL_CARD)


def content_box(data: np.ndarray) -> tuple[slice, slice, slice]:
    """Array slices (X, Y, Z) of the bounding box of the voxels that are non-zero in any frame.

    The methods segment this box and the labels are pasted back: exact zeros around the
    content (a wider field of view zero-padded, a masked-out background, empty slices) then
    change nothing. Without the box they did: the network's input is resampled to the
    bundle's pixel size on a lattice tied to the array's corner and extent, and its sliding
    windows and instance norms cover that extent, so the same cine zero-padded by a few
    voxels (the ablation's space_mismatch fault) got another myocardium and RV (~10 % of
    their voxels; median segment thickening 27 % instead of 20 %). With no non-zero voxel,
    the whole array (the methods raise their own errors).
    """
    nz = np.any(data != 0, axis=3)
    if not nz.any():
        return (slice(None),) * 3  # type: ignore[return-value]
    box = []
    for axis in range(3):
        hit = np.flatnonzero(nz.any(axis=tuple(a for a in range(3) if a != axis)))
        box.append(slice(int(hit[0]), int(hit[-1]) + 1))
    return tuple(box)  # type: ignore[return-value]


def _canonical(cine: Cine) -> tuple[Cine, np.ndarray]:
    """The cine on the canonical in-plane orientation (:func:`.cardiac_net.inplane_ornt`; the
    slice axis keeps its place, its sense fixed by the world too) and the nibabel orientation
    that undoes it. Every method then sees the same array whatever the stored voxel order:
    the classical method alone (the fallback when the network cannot run) gave another RV on
    a cine flipped in-plane (RV EF 91.5 % vs 83.5 % in the cardiac ablation)."""
    from nibabel import orientations as nib_ornt

    from .cardiac_net import inplane_ornt

    affine = np.asarray(cine.affine, np.float64)
    ornt = inplane_ornt(affine)
    normal = affine[:3, 2]
    ornt[2, 1] = -1.0 if normal[int(np.argmax(np.abs(normal)))] < 0 else 1.0
    data = np.asarray(cine.data)
    canon = nib_ornt.apply_orientation(data, ornt)
    return Cine(np.ascontiguousarray(canon), affine @ nib_ornt.inv_ornt_aff(ornt, data.shape[:3]),
                dict(cine.meta)), ornt


def to_stored_grid(labels: np.ndarray, shape: tuple[int, ...], box: tuple[slice, slice, slice],
                   ornt: np.ndarray) -> np.ndarray:
    """Labels of the canonical content box (:func:`_canonical` of :func:`_crop`) back on the
    stored grid of ``shape``, zero outside the box."""
    from nibabel import orientations as nib_ornt

    from .cardiac_net import inverse_ornt

    out = np.zeros(shape, np.int16)
    out[box] = nib_ornt.apply_orientation(labels, inverse_ornt(ornt))
    return out


def _crop(cine: Cine, box: tuple[slice, slice, slice]) -> Cine:
    """The cine restricted to ``box`` (same lattice: only the affine's origin moves)."""
    start = np.array([b.start or 0 for b in box], np.float64)
    affine = np.asarray(cine.affine, np.float64).copy()
    affine[:3, 3] = affine[:3, 3] + affine[:3, :3] @ start
    return Cine(np.asarray(cine.data)[box], affine, dict(cine.meta))


# The version names the shipped network too: the node cache keys on (tool, version, params,
# inputs), so new weights under the same version would be served old labels from a cache.
# 2.6 = 2.5 + restore_lost_frames; 2.5 = cardiac_unet2d 0.3.0 (pericardial fat widened in training).
@tool("seg.cardiac", version=VERSION, milestone="segmentation",
      resources={"num_cpus": 1, "memory_mb": 2048}, gpu="optional", output="labels")
def cardiac(cine: Cine, params: CardiacParams, device: str = "cpu") -> Mask:
    """RV/MYO/LV labels (1/2/3) on every frame of a short-axis cine.

    Args:
        cine: (X, Y, Z, T) short-axis stack; Z is the slice axis.
        params: ``method`` (auto: ``bundle_dir`` alone if given, else the hybrid of the classical
            LV and the shipped ``cardiac_unet2d`` network's MYO/RV, the classical labels alone as
            fallback), ``bundle_dir`` for a MONAI bundle (one channel: the frame; two: the frame
            and its slice's temporal std).
        device: "cpu" or "cuda" (network inference only).

    The methods run on the bounding box of the cine's non-zero content (:func:`content_box`,
    in ``meta["content_box"]``), so a zero-padded field of view gives the same labels, and on
    the canonical in-plane orientation with the slice sense fixed by the world (:func:`_canonical`),
    so a transposed or flipped grid does too, for every method.

    Returns:
        Mask (X, Y, Z, T) on the cine's grid with labels {1: RV, 2: MYO, 3: LV} (0 outside the
        content box); ``meta`` says which method ran (and why the classical one, when it stood
        in for the network).

    Raises:
        ToolError: ``shape`` unless 4-D, ``numeric`` for NaN/Inf; bundle errors with
            ``method="network"``/``"hybrid"`` or an explicit ``bundle_dir``.
    """
    full = require_volume(cine, "cine", ndim=4)
    affine = cine.affine
    box = content_box(full)
    cine, ornt = _canonical(_crop(cine, box))
    data = np.asarray(cine.data)
    t = data.shape[3]
    if params.method == "classical":
        labels, meta = classical_labels(cine, params.max_wall_mm)
    elif params.method == "hybrid":
        labels, meta = _hybrid(cine, data, params, device)
    elif params.bundle_dir or params.method == "network":
        from .bundle import shipped_bundle

        path = params.bundle_dir or str(shipped_bundle())
        labels, meta = _network(cine, data, params, device, path)
        if problem := network_problem(labels):
            meta["check"] = problem  # a bundle the caller chose is not replaced; the trace says why it looks wrong
        meta["agreement"] = dice_by_label(classical_labels(cine, params.max_wall_mm)[0], labels, GROUPS)
    else:
        labels, meta = _auto(cine, data, params, device)
    flag_unconserved_myocardium(labels, params.min_myo_volume_ratio, meta)
    meta["method_card"] = _card(meta)
    reason = _no_second_reading(meta)
    net = meta.get("network") if isinstance(meta.get("network"), dict) else meta
    own = net.get("low_confidence_threshold")  # the bundle's own, chosen on its development data
    attach(meta, confidence("seg.cardiac", meta.pop("agreement", None), reason, threshold=own))
    out = to_stored_grid(labels, full.shape, box, ornt)
    vox = cine.voxel_volume_ml
    lv = np.count_nonzero(out == 3, axis=(0, 1, 2)) * vox
    meta.update(lv_volume_curve_ml=[float(v) for v in lv], n_frames=t,
                content_box=[[b.start or 0, b.stop if b.stop is not None else n] for b, n in zip(box, full.shape)])
    return Mask(out, np.asarray(affine, np.float64).copy(), meta, labels=dict(CARDIAC_LABELS))
