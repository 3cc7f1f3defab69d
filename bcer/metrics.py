"""The one metrics module: overlap, box and image-error measures with one meaning each.

Pure numpy; imports nothing of bcer, so tools, validators, plausibility checks, R4 and the
bench all use the same definitions.

Conventions (the same everywhere):

- Masks are compared as booleans. Two empty masks agree perfectly: ``dice`` is 1.0. A
  caller that wants "no truth, no score" (the bench on a case without lesions) decides that
  itself before calling.
- Boxes are voxel boxes ``[[min_i, min_j, min_k], [max_i, max_j, max_k]]`` with inclusive
  minimum and exclusive maximum (numpy slice convention). An empty box has IoU 0.
- ``nrmse`` is plain: RMS error over RMS of the reference. ``nrmse_scaled`` is the
  reconstruction metric: magnitudes inside the object, after the least-squares gain
  (coil-combined images carry an arbitrary global scale).
- ``frame_match`` judges a chosen cardiac phase (ED/ES frame) against the truth's volume
  curve: exact, or within ``tolerance`` x the curve's maximum (0: only an exact tie in the
  truth's own voxel count, which ``argmax`` resolves to the earlier frame for no physiological
  reason).
- ``wilson_interval`` is the 95 % score interval of a proportion ``k / n`` (a sensitivity or an
  accuracy over a few cases): small samples get honest, asymmetric bounds, never [p, p].
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .contracts.errors import ErrorCode, ToolError

__all__ = ["box_iou", "box_volume", "dice", "frame_match", "nrmse", "nrmse_scaled", "object_mask", "psnr", "wilson_interval"]


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two masks (booleans); 1.0 when both are empty.

    >>> dice(np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0]))
    0.6666666666666666
    >>> dice(np.zeros(3), np.zeros(3))
    1.0
    """
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if a.shape != b.shape:
        raise ToolError(ErrorCode.shape, f"dice: the masks' shapes differ, {a.shape} vs {b.shape}",
                        hint="resample one mask onto the other's grid first")
    total = int(a.sum()) + int(b.sum())
    return 1.0 if total == 0 else 2.0 * float(np.logical_and(a, b).sum()) / total


def box_volume(box: Sequence[Sequence[float]] | Any) -> float:
    """Voxels in a ``[[min...], [max...]]`` box (0 for an empty or inverted box)."""
    lo, hi = np.asarray(box[0], np.float64), np.asarray(box[1], np.float64)
    return float(np.prod(np.clip(hi - lo, 0, None)))


def box_iou(a: Sequence[Sequence[float]] | Any, b: Sequence[Sequence[float]] | Any) -> float:
    """Intersection over union of two voxel boxes (inclusive min, exclusive max).

    >>> box_iou([[0, 0, 0], [2, 2, 2]], [[1, 0, 0], [3, 2, 2]])
    0.3333333333333333
    """
    lo = np.maximum(np.asarray(a[0], np.float64), np.asarray(b[0], np.float64))
    hi = np.minimum(np.asarray(a[1], np.float64), np.asarray(b[1], np.float64))
    inter = float(np.prod(np.clip(hi - lo, 0, None)))
    union = box_volume(a) + box_volume(b) - inter
    return inter / union if union > 0 else 0.0


def frame_match(chosen: int, truth_frame: int, curve: Sequence[float], tolerance: float = 0.0) -> bool:
    """True when ``chosen`` is ``truth_frame``, or its true volume ``curve[chosen]`` is within
    ``tolerance`` x ``max(curve)`` of the truth frame's (``tolerance=0``: an exact tie)."""
    if chosen == truth_frame:
        return True
    v = np.asarray(curve, np.float64)
    return bool(abs(v[chosen] - v[truth_frame]) <= tolerance * float(v.max()))


def wilson_interval(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k / n`` (default 95 %); ``(0, 1)`` when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ToolError(ErrorCode.value_range, f"wilson_interval: k={k} is outside 0..n={n}",
                        hint="k counts successes among n trials: 0 <= k <= n", arg="k")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def nrmse(x: np.ndarray, ref: np.ndarray) -> float:
    """Root-mean-square error normalised by the reference's RMS (0 is perfect).

    Complex arrays (k-space, coil images) are compared as complex numbers, ``|x - ref|``.
    """
    x, ref = np.asarray(x), np.asarray(ref)
    dtype = np.complex128 if np.iscomplexobj(x) or np.iscomplexobj(ref) else np.float64
    x, ref = x.astype(dtype, copy=False), ref.astype(dtype, copy=False)
    if x.shape != ref.shape:
        raise ToolError(ErrorCode.shape, f"nrmse: shapes differ, {x.shape} vs {ref.shape}",
                        hint="compare images on the same grid")
    return float(np.sqrt(np.mean(np.abs(x - ref) ** 2)) / (np.sqrt(np.mean(np.abs(ref) ** 2)) or 1.0))


def psnr(x: np.ndarray, ref: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB, peak = the reference's maximum."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    mse = float(np.mean((x - ref) ** 2))
    return float("inf") if mse == 0 else float(10.0 * np.log10(float(ref.max()) ** 2 / mse))


def object_mask(truth: np.ndarray, threshold: float = 0.05) -> np.ndarray:
    """Voxels whose truth magnitude is above ``threshold`` x max (the object support)."""
    mag = np.abs(np.asarray(truth, dtype=np.float64))
    return mag > threshold * float(mag.max())


def nrmse_scaled(recon: np.ndarray, truth: np.ndarray, mask: np.ndarray | None = None,
                 threshold: float = 0.05) -> float:
    """Least-squares-scaled NRMSE of magnitudes inside ``mask`` (default: ``object_mask``).

    The reconstruction is scaled by ``a = <|x|, |y|> / <|x|, |x|>``, then
    ``NRMSE = ||a|x| - |y||| / |||y|||`` over the mask.
    """
    x = np.abs(np.asarray(recon, dtype=np.float64))
    y = np.abs(np.asarray(truth, dtype=np.float64))
    if x.shape != y.shape:
        raise ToolError(ErrorCode.shape, f"recon shape {x.shape} != truth shape {y.shape}",
                        hint="crop both to the recon matrix (KSpace.recon_crop) first")
    m = object_mask(y, threshold) if mask is None else np.asarray(mask, dtype=bool)
    x, y = x[m], y[m]
    denom = float(np.dot(x, x))
    scale = float(np.dot(x, y)) / denom if denom > 0 else 0.0
    return float(np.linalg.norm(scale * x - y) / max(np.linalg.norm(y), 1e-30))
