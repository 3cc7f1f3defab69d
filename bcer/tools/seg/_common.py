"""Shared pieces of the ``seg.*`` tools: bundle params, mask building, small morphology."""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import ndimage as ndi


class BundleParams(BaseModel):
    """Params every ``seg.*`` tool shares: an optional MONAI bundle and its sliding window."""

    model_config = ConfigDict(extra="forbid")
    bundle_dir: str | None = Field(None, description="local MONAI bundle folder; None = classical method")
    # None: the bundle's own inferer settings (a model-zoo bundle states them in inference.json)
    roi_size: int | None = Field(None, ge=8, le=512,
                                 description="sliding-window size per spatial axis (bundle path; None: the bundle's)")
    sw_batch_size: int | None = Field(None, ge=1, le=256,
                                      description="windows per forward pass (bundle path; None: the bundle's)")
    overlap: float | None = Field(None, ge=0.0, lt=1.0,
                                  description="sliding-window overlap fraction (bundle path; None: the bundle's)")


def largest_component(mask: np.ndarray, structure: np.ndarray | None = None) -> np.ndarray:
    """The largest connected component of a boolean mask (empty stays empty)."""
    lab, n = ndi.label(mask, structure=structure)
    if n <= 1:
        return lab > 0
    sizes = np.bincount(lab.ravel())
    sizes[0] = 0
    return lab == int(np.argmax(sizes))


def fill_holes_2d(mask: np.ndarray, axis: int = 2) -> np.ndarray:
    """Fill holes slice by slice along ``axis`` (3-D filling misses holes open at the ends)."""
    out = np.moveaxis(mask.copy(), axis, 0)
    for i in range(out.shape[0]):
        out[i] = ndi.binary_fill_holes(out[i])
    return np.moveaxis(out, 0, axis)


def ball(radius_mm: float, spacing: tuple[float, ...]) -> np.ndarray:
    """An ellipsoidal structuring element of ``radius_mm`` on an anisotropic grid."""
    r = [max(int(np.floor(radius_mm / s)), 0) for s in spacing]
    grids = np.ogrid[tuple(slice(-k, k + 1) for k in r)]
    d = sum((g * s / max(radius_mm, 1e-6)) ** 2 for g, s in zip(grids, spacing))
    return d <= 1.0
