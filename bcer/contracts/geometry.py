"""Voxel-to-world geometry helpers shared by every artifact (RAS+ millimetres, NIfTI convention)."""
from __future__ import annotations

import numpy as np

from .errors import ErrorCode, ToolError

AXCODES = (("L", "R"), ("P", "A"), ("I", "S"))


def as_affine(affine) -> np.ndarray:
    a = np.asarray(affine, dtype=np.float64)
    if a.shape != (4, 4) or not np.all(np.isfinite(a)):
        raise ToolError(ErrorCode.value_range, f"affine must be a finite 4x4 matrix, got shape {a.shape}",
                        hint="an image's voxel-to-world affine is a 4x4 matrix of finite numbers", arg="affine")
    if abs(np.linalg.det(a[:3, :3])) < 1e-12:
        raise ToolError(ErrorCode.value_range, "affine is singular (its 3x3 part has determinant 0)",
                        hint="check the image header's spacing and direction (a zero voxel size?)", arg="affine")
    return a


def spacing(affine) -> tuple[float, float, float]:
    """Voxel size in mm along each array axis (column norms of the 3x3 part)."""
    a = np.asarray(affine, dtype=np.float64)
    return tuple(float(v) for v in np.linalg.norm(a[:3, :3], axis=0))


def orientation(affine) -> str:
    """Axis codes such as 'RAS' or 'LPI': the world direction each array axis increases toward."""
    a = np.asarray(affine, dtype=np.float64)[:3, :3]
    cols = a / np.linalg.norm(a, axis=0)
    codes = []
    for c in cols.T:
        axis = int(np.argmax(np.abs(c)))
        codes.append(AXCODES[axis][1] if c[axis] > 0 else AXCODES[axis][0])
    return "".join(codes)


def vox2world(affine, ijk) -> np.ndarray:
    """Map voxel indices (N,3) or (3,) to RAS world mm."""
    p = np.asarray(ijk, dtype=np.float64)
    a = np.asarray(affine, dtype=np.float64)
    return p @ a[:3, :3].T + a[:3, 3]


def world2vox(affine, xyz) -> np.ndarray:
    inv = np.linalg.inv(np.asarray(affine, dtype=np.float64))
    p = np.asarray(xyz, dtype=np.float64)
    return p @ inv[:3, :3].T + inv[:3, 3]


def voxel_volume_ml(affine) -> float:
    return float(abs(np.linalg.det(np.asarray(affine, dtype=np.float64)[:3, :3]))) / 1000.0


def same_grid(a1, shape1, a2, shape2, atol: float = 1e-3) -> bool:
    return tuple(shape1[:3]) == tuple(shape2[:3]) and np.allclose(a1, a2, atol=atol)
