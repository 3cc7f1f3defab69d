"""The shipped prostate network (``bcer/assets/bundles/prostate_unet3d``): how ``seg.prostate``
feeds it and reads it back. ``scripts/train_prostate_bundle.py`` trains it through these same
functions, so training and inference see identical inputs.

1. The T2w volume is resampled onto a *canonical grid*: axis-aligned in RAS, at the bundle's
   ``pixdim`` (2 x 2 x 3 mm), covering the T2w field of view (voxels outside it are 0). Scanner
   obliquity, flips and slice-numbering direction are thereby gone before the network sees the
   image; a finer T2w is low-pass filtered first so the coarser samples do not alias its noise.
2. Intensities are z-scored over the non-zero voxels (vendor scale and offset drop out).
3. A 3-D MONAI UNet gives softmax probabilities of background, PZ and TZ, by sliding window.
   An ensemble bundle (``bcer.members``) averages every member's reading of the volume and of
   its left-right mirror.
4. The probabilities are resampled back onto the T2w grid (linear, so the boundary is placed
   between canonical voxels) and the label is their argmax; the gland is the largest connected
   component, with its holes filled.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage as ndi

from ...contracts.artifacts import Image
from ...contracts.errors import ErrorCode, ToolError
from ...metrics import dice
from ..resample import sample_on_grid
from ._common import fill_holes_2d, largest_component

log = logging.getLogger(__name__)

BUNDLE_NAME = "prostate_unet3d"
CANONICAL_SPACING = (2.0, 2.0, 3.0)
MAX_EXTENT_MM = (260.0, 260.0, 130.0)  # the canonical box never exceeds this (centred on the FOV)

__all__ = ["BUNDLE_NAME", "CANONICAL_SPACING", "canonical_grid", "to_canonical", "from_canonical",
           "zscore", "predict_probabilities", "segment", "shipped_prostate_bundle"]


def shipped_prostate_bundle() -> Path | None:
    """The shipped bundle folder, or None when it is not installed."""
    path = Path(__file__).resolve().parents[2] / "assets" / "bundles" / BUNDLE_NAME
    return path if (path / "models" / "model.pt").is_file() else None


def canonical_grid(affine: np.ndarray, shape: tuple[int, ...],
                   spacing: tuple[float, float, float] = CANONICAL_SPACING) -> tuple[np.ndarray, tuple[int, int, int]]:
    """RAS-aligned grid at ``spacing`` over the world box of a volume's voxel centres."""
    a = np.asarray(affine, np.float64)
    corners = np.array([[i, j, k] for i in (0, shape[0] - 1) for j in (0, shape[1] - 1) for k in (0, shape[2] - 1)],
                       dtype=np.float64)
    world = corners @ a[:3, :3].T + a[:3, 3]
    lo, hi = world.min(axis=0), world.max(axis=0)
    centre, extent = (lo + hi) / 2.0, np.minimum(hi - lo, MAX_EXTENT_MM)
    sp = np.asarray(spacing, np.float64)
    n = np.maximum(np.floor(extent / sp).astype(int) + 1, 1)
    out = np.diag([*sp, 1.0])
    out[:3, 3] = centre - sp * (n - 1) / 2.0
    return out, (int(n[0]), int(n[1]), int(n[2]))


def to_canonical(data: np.ndarray, affine: np.ndarray, grid: tuple[np.ndarray, tuple[int, ...]],
                 smooth: bool = True) -> np.ndarray:
    """A volume on the canonical grid; finer source axes are Gaussian low-passed first."""
    src = np.asarray(data, np.float32)
    if smooth:
        src_sp = np.linalg.norm(np.asarray(affine, np.float64)[:3, :3], axis=0)
        target = float(np.mean(np.diag(grid[0])[:2]))  # in-plane canonical spacing (the finer one)
        sigma = [0.45 * max(0.0, target / s - 1.0) for s in src_sp]
        if any(s > 0.1 for s in sigma):
            src = ndi.gaussian_filter(src, sigma)
    return sample_on_grid(src, affine, grid[0], grid[1], order=1)


def from_canonical(channels: np.ndarray, grid: tuple[np.ndarray, tuple[int, ...]], affine: np.ndarray,
                   shape: tuple[int, ...]) -> np.ndarray:
    """(C, canonical) maps resampled linearly onto a volume's grid: (C, X, Y, Z)."""
    return np.stack([sample_on_grid(c, grid[0], affine, shape[:3], order=1) for c in channels])


def zscore(x: np.ndarray) -> np.ndarray:
    """Z-score over the non-zero voxels (outside the field of view stays 0)."""
    out = np.array(x, dtype=np.float32)  # a copy: object-store arrays are read-only
    fg = out != 0
    if fg.any():
        v = out[fg]
        out[fg] = (v - v.mean()) / max(float(v.std()), 1e-6)
    return out


def predict_probabilities(network: Any, canon: np.ndarray, roi: tuple[int, ...], device: Any = "cpu",
                          overlap: float = 0.25, sw_batch_size: int = 2) -> np.ndarray:
    """Softmax probabilities (C, canonical shape) of a z-scored canonical volume."""
    import torch
    from monai.inferers import sliding_window_inference

    x = torch.from_numpy(np.ascontiguousarray(canon[None, None], dtype=np.float32)).to(device)
    with torch.no_grad():
        logits = sliding_window_inference(x, tuple(roi), sw_batch_size, network, overlap=overlap, mode="gaussian")
        return torch.softmax(logits, dim=1)[0].cpu().numpy()


def flip_agreement(prob: np.ndarray, flipped: np.ndarray) -> dict[str, float]:
    """Dice of gland, PZ and TZ between the arg-max of two (C, ...) probability maps."""
    from .confidence import dice_by_label

    a, b = np.argmax(prob, axis=0), np.argmax(flipped, axis=0)
    return dice_by_label(a, b, {"gland": (1, 2), "PZ": (1,), "TZ": (2,)})


def _ensemble(networks: tuple[Any, ...], canon: np.ndarray, roi: tuple[int, ...], device: Any, overlap: float,
              sw_batch_size: int) -> tuple[np.ndarray, dict[str, float], float]:
    """An ensemble's probabilities, its self-consistency and its members' agreement.

    Each member reads the volume and its left-right mirror (mirrored back); the answer is the
    mean of all readings (nnU-Net's mirroring and fold averaging). The score is, as for one
    network, the ensemble's reading of the volume against its reading of the mirror (Dice of
    gland, PZ, TZ). The lowest gland Dice between two members is returned for the record only:
    as a score it flagged few wrong answers (docs/segmenters.md), since the ensemble is often
    right where one member is wrong.
    """
    mirror = np.ascontiguousarray(canon[::-1])
    direct = [predict_probabilities(net, canon, roi, device, overlap, sw_batch_size) for net in networks]
    mirrored = [predict_probabilities(net, mirror, roi, device, overlap, sw_batch_size)[:, ::-1] for net in networks]
    glands = [np.argmax(d + m, axis=0) > 0 for d, m in zip(direct, mirrored)]
    members = min(dice(a, b) for i, a in enumerate(glands) for b in glands[i + 1:])
    one, other = np.mean(direct, axis=0), np.mean(mirrored, axis=0)
    return (one + other) / 2, flip_agreement(one, other), float(members)


def segment(t2w: Image, bundle_dir: str | Path, device: str = "cpu", overlap: float | None = None,
            sw_batch_size: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Zones (0/1 PZ/2 TZ) on the T2w grid from the bundle, and audit meta.

    Raises:
        ToolError: ``input_missing``/``schema`` from the bundle loader; ``value_range`` when
            the network finds no gland.
    """
    from .bundle import load_bundle

    bundle = load_bundle(bundle_dir, device)
    opts = bundle.meta.get("bcer", {})
    spacing = tuple(float(v) for v in opts.get("pixdim", CANONICAL_SPACING))
    grid = canonical_grid(t2w.affine, t2w.shape, spacing)
    canon = zscore(to_canonical(t2w.data, t2w.affine, grid))
    from .._gpu import torch_device

    # None: the settings the network was trained and validated with
    overlap = 0.25 if overlap is None else overlap
    sw_batch_size = 2 if sw_batch_size is None else sw_batch_size
    members = None
    if bundle.members:
        prob, agreement, members = _ensemble(bundle.networks, canon, bundle.roi_size, torch_device(device), overlap,
                                             sw_batch_size)
    else:
        prob = predict_probabilities(bundle.network, canon, bundle.roi_size, torch_device(device), overlap,
                                     sw_batch_size)
        # self-consistency: the same network on the left-right mirrored volume, mirrored back
        flipped = predict_probabilities(bundle.network, np.ascontiguousarray(canon[::-1]), bundle.roi_size,
                                        torch_device(device), overlap, sw_batch_size)[:, ::-1]
        agreement = flip_agreement(prob, flipped)
    on_t2 = from_canonical(prob, grid, t2w.affine, t2w.shape)
    outside = on_t2.sum(axis=0) < 0.5  # beyond the canonical box (never for a whole FOV): background
    labels = np.argmax(on_t2, axis=0).astype(np.int16)
    labels[outside] = 0
    gland = largest_component(labels > 0, ndi.generate_binary_structure(3, 1))
    if not gland.any():
        raise ToolError(ErrorCode.value_range, "the prostate network found no gland in 't2w'", arg="t2w",
                        hint="is the prostate in the field of view? the classical method is the fallback")
    gland = fill_holes_2d(ndi.binary_fill_holes(gland))
    zones = np.where(gland, np.where(labels == 2, 2, 1), 0).astype(np.int16)
    meta = {"method": "monai_bundle", "bundle": bundle.path, "bundle_name": bundle.meta.get("name", BUNDLE_NAME),
            "bundle_version": bundle.meta.get("version", ""), "canonical_spacing": list(spacing),
            "canonical_shape": list(grid[1]), "roi_size": list(bundle.roi_size), "overlap": overlap,
            "device": device, "mean_gland_probability": float(1.0 - on_t2[0][gland].mean()),
            "agreement": agreement, "ensemble_members": len(bundle.networks),
            # a flag threshold belongs to the model: a retrained bundle states its own
            "low_confidence_threshold": opts.get("low_confidence_threshold")}
    if members is not None:
        meta["members_gland_agreement"] = members
    return zones, meta
