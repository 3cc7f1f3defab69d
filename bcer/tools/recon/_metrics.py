"""The reconstruction error metric used by the recon tests and benchmark.

``nrmse(recon, truth)`` compares magnitudes inside the object: voxels where the truth
magnitude exceeds ``threshold`` times its maximum. The reconstruction is first scaled by
the least-squares factor ``a = <|x|, |y|> / <|x|, |x|>`` (coil-combined images carry an
arbitrary global gain), then ``NRMSE = ||a|x| - |y||| / |||y|||`` over those voxels.
"""
from __future__ import annotations

import numpy as np


def object_mask(truth: np.ndarray, threshold: float = 0.05) -> np.ndarray:
    """Voxels whose truth magnitude is above ``threshold`` x max (the object support)."""
    mag = np.abs(np.asarray(truth, dtype=np.float64))
    return mag > threshold * float(mag.max())


def nrmse(recon: np.ndarray, truth: np.ndarray, mask: np.ndarray | None = None,
          threshold: float = 0.05) -> float:
    """Least-squares-scaled NRMSE of magnitudes inside ``mask`` (default: ``object_mask``)."""
    x = np.abs(np.asarray(recon, dtype=np.float64))
    y = np.abs(np.asarray(truth, dtype=np.float64))
    if x.shape != y.shape:
        raise ValueError(f"recon shape {x.shape} != truth shape {y.shape}")
    m = object_mask(y, threshold) if mask is None else np.asarray(mask, dtype=bool)
    x, y = x[m], y[m]
    denom = float(np.dot(x, x))
    scale = float(np.dot(x, y)) / denom if denom > 0 else 0.0
    return float(np.linalg.norm(scale * x - y) / max(np.linalg.norm(y), 1e-30))
