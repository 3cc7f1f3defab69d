"""numpy/RAS <-> SimpleITK/LPS conversion, the one place that knows both conventions.

bcer arrays are (X, Y, Z) with a NIfTI-style affine mapping voxel (i, j, k) to RAS+ mm.
SimpleITK arrays are (Z, Y, X) and its physical space is LPS: x_lps = -x_ras, y_lps = -y_ras.
With ``F = diag(-1, -1, 1)``: ``origin = F @ t``, ``direction @ diag(spacing) = F @ A``, so an
ITK physical point is always the same anatomical point as the RAS affine says, for oblique
and flipped affines alike. Transforms follow ITK's direction (fixed point -> moving point);
their 4x4 RAS form is ``F4 @ M_lps @ F4``.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import SimpleITK as sitk

from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import as_affine

_FLIP = np.diag([-1.0, -1.0, 1.0])
_FLIP4 = np.diag([-1.0, -1.0, 1.0, 1.0])

INTERPOLATORS: dict[str, int] = {
    "nearest": sitk.sitkNearestNeighbor,
    "linear": sitk.sitkLinear,
    "bspline": sitk.sitkBSpline,
}


def geometry_from_affine(affine: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(origin, spacing, direction) in ITK's LPS terms for a RAS voxel-to-world affine."""
    a = as_affine(affine)
    lps = _FLIP @ a[:3, :3]
    spacing = np.linalg.norm(lps, axis=0)
    direction = lps / spacing
    origin = _FLIP @ a[:3, 3]
    return tuple(origin.tolist()), tuple(spacing.tolist()), tuple(direction.ravel().tolist())


def affine_from_geometry(origin: Any, spacing: Any, direction: Any) -> np.ndarray:
    """The RAS voxel-to-world affine of an ITK geometry (inverse of ``geometry_from_affine``)."""
    d = np.asarray(direction, dtype=np.float64).reshape(3, 3)
    a = np.eye(4)
    a[:3, :3] = _FLIP @ d @ np.diag(np.asarray(spacing, dtype=np.float64))
    a[:3, 3] = _FLIP @ np.asarray(origin, dtype=np.float64)
    return a


def to_sitk(data: np.ndarray, affine: np.ndarray, dtype: Any | None = None) -> sitk.Image:
    """A SimpleITK image of an (X, Y, Z) array on the grid ``affine`` describes."""
    arr = np.asarray(data)
    if arr.ndim != 3:
        raise ToolError(ErrorCode.shape, f"to_sitk expects a 3-D (X, Y, Z) array, got shape {arr.shape}",
                        hint="give a 3-D volume (pick one frame or echo of a 4-D series first)")
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    img = sitk.GetImageFromArray(np.ascontiguousarray(arr.transpose(2, 1, 0)))
    origin, spacing, direction = geometry_from_affine(affine)
    img.SetOrigin(origin)
    img.SetSpacing(spacing)
    img.SetDirection(direction)
    return img


def from_sitk(img: sitk.Image) -> tuple[np.ndarray, np.ndarray]:
    """(data (X, Y, Z), RAS affine) of a 3-D SimpleITK image."""
    if img.GetDimension() != 3:
        raise ToolError(ErrorCode.shape, f"from_sitk expects a 3-D image, got {img.GetDimension()}-D",
                        hint="give a 3-D volume")
    data = sitk.GetArrayFromImage(img).transpose(2, 1, 0)
    return np.ascontiguousarray(data), affine_from_geometry(img.GetOrigin(), img.GetSpacing(), img.GetDirection())


def reference_grid(shape: tuple[int, ...], affine: np.ndarray) -> sitk.Image:
    """An empty image that only carries a grid (for ``sitk.Resample`` reference images)."""
    img = sitk.Image([int(s) for s in shape[:3]], sitk.sitkUInt8)
    origin, spacing, direction = geometry_from_affine(affine)
    img.SetOrigin(origin)
    img.SetSpacing(spacing)
    img.SetDirection(direction)
    return img


def transform_to_ras(tx: sitk.Transform) -> np.ndarray:
    """The 4x4 RAS matrix of a linear SimpleITK transform (fixed point -> moving point)."""
    flat = _flatten_linear(tx)
    mat = np.asarray(flat.GetMatrix(), dtype=np.float64).reshape(3, 3)
    c = np.asarray(flat.GetCenter(), dtype=np.float64)
    t = np.asarray(flat.GetTranslation(), dtype=np.float64)
    m = np.eye(4)
    m[:3, :3] = mat
    m[:3, 3] = t + c - mat @ c  # ITK: y = M (x - c) + c + t
    return _FLIP4 @ m @ _FLIP4


def _flatten_linear(tx: sitk.Transform) -> sitk.Transform:
    """One matrix+offset transform from a (possibly composite) chain of linear transforms."""
    if tx.GetName() == "CompositeTransform":
        comp = sitk.CompositeTransform(tx)
        total = np.eye(4)
        # ITK applies the last-added transform first: T(x) = T0(T1(...Tn(x)))
        for i in range(comp.GetNumberOfTransforms()):
            total = total @ _FLIP4 @ transform_to_ras(comp.GetNthTransform(i)) @ _FLIP4
        return ras_to_transform(_FLIP4 @ total @ _FLIP4)
    if not hasattr(tx, "GetMatrix"):
        tx = tx.Downcast()
    if tx.GetName() == "TranslationTransform":
        return sitk.AffineTransform(np.eye(3).ravel().tolist(), tx.GetOffset())
    if not hasattr(tx, "GetMatrix"):
        # a programming error: bcer's registration only builds linear transforms
        raise ValueError(f"transform {tx.GetName()} is not linear")
    return tx


def ras_to_transform(matrix: np.ndarray) -> sitk.AffineTransform:
    """A SimpleITK affine transform (LPS) from a 4x4 RAS matrix (fixed point -> moving point)."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (4, 4) or not np.all(np.isfinite(m)):
        raise ToolError(ErrorCode.value_range, f"transform matrix must be a finite 4x4, got shape {m.shape}",
                        hint="a transform is a 4x4 RAS matrix of finite numbers", arg="transform")
    lps = _FLIP4 @ m @ _FLIP4
    tx = sitk.AffineTransform(3)
    tx.SetMatrix(lps[:3, :3].ravel().tolist())
    tx.SetTranslation(lps[:3, 3].tolist())
    return tx


_THREADS_LOCK = threading.Lock()


@contextlib.contextmanager
def itk_threads(n: int) -> Iterator[None]:
    """ITK's default thread count set to ``n`` for the block, restored after.

    ITK's v4 metrics take their threads from this process-wide default, not from the
    registration method's own setting, and multi-threaded Mattes MI sums its per-thread
    histograms in a varying order: with more than one thread the same registration differs
    run to run. The lock keeps two blocks in one process from interleaving their settings."""
    with _THREADS_LOCK:
        before = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(int(n))
        try:
            yield
        finally:
            sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(before)
