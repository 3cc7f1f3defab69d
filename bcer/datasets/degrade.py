"""Known degradations for phantoms: Rician noise, bias field, rigid motion, thick slices.

Each one is exactly reproducible from its arguments (and the ``rng``), so the generator can
record it in the phantom's ground truth and a test can measure how well a tool undoes it.

Transform direction (registration tests depend on this):
    ``rigid_matrix(...)`` returns a 4x4 world->world matrix ``M`` acting on RAS+ mm points:
    ``p' = R @ (p - center_world) + center_world + translation_mm``.
    ``move_image(image, M)`` moves the *content*: the tissue that sat at world point ``p``
    in ``image`` sits at ``M @ p`` in the result (same grid, same affine), i.e.
    ``moved(M @ p) == image(p)``. In ITK/``bcer.contracts.artifacts.Transform`` terms, with
    ``image`` as the fixed image and the result as the moving image, ``M`` is exactly the
    fixed->moving transform that a registration should recover.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

import numpy as np
from scipy.spatial.transform import Rotation

from ..contracts.artifacts import Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from ..tools.resample import sample_on_grid

log = logging.getLogger(__name__)

__all__ = ["rician_noise", "bias_field", "rigid_matrix", "move_image", "downsample_through_plane",
           "rigid_params"]


def rician_noise(data: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Magnitude of ``data`` plus complex Gaussian noise of std ``sigma`` per channel.

    ``sigma`` is absolute (same units as ``data``); ``sigma=0`` returns a float32 copy.
    """
    if sigma < 0:
        raise ToolError(ErrorCode.value_range, f"noise sigma must be >= 0, got {sigma}", arg="sigma")
    x = np.asarray(data, dtype=np.float32)
    if sigma == 0:
        return x.copy()
    re = x + rng.normal(0.0, sigma, size=x.shape).astype(np.float32)
    im = rng.normal(0.0, sigma, size=x.shape).astype(np.float32)
    return np.sqrt(re * re + im * im)


def bias_field(shape: Sequence[int], rng: np.random.Generator, strength: float = 0.3) -> np.ndarray:
    """Smooth multiplicative field with mean 1 and min > 0 (like a receive-coil shading).

    The log-field is a random combination of low-order cosines over the grid (at most one
    period across the field of view), scaled so its peak magnitude is ``strength``; the
    field is ``exp`` of it (hence positive), divided by its mean.

    Returns:
        float32 array of ``shape[:3]``.
    """
    if strength < 0:
        raise ToolError(ErrorCode.value_range, f"bias strength must be >= 0, got {strength}",
                        arg="strength")
    shape = tuple(int(n) for n in shape[:3])
    if strength == 0:
        return np.ones(shape, dtype=np.float32)
    axes = [np.linspace(0.0, np.pi, n) for n in shape]
    log_f = np.zeros(shape, dtype=np.float64)
    for fx in range(3):
        for fy in range(3):
            for fz in range(3):
                if fx + fy + fz == 0 or fx + fy + fz > 2:
                    continue
                c = rng.normal() / (fx + fy + fz)
                log_f += c * (np.cos(fx * axes[0])[:, None, None] * np.cos(fy * axes[1])[None, :, None]
                              * np.cos(fz * axes[2])[None, None, :])
    peak = float(np.abs(log_f).max()) or 1.0
    field = np.exp(log_f * (strength / peak))
    return (field / field.mean()).astype(np.float32)


def rigid_matrix(rotation_deg: Sequence[float] = (0.0, 0.0, 0.0),
                 translation_mm: Sequence[float] = (0.0, 0.0, 0.0),
                 center_world: Sequence[float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """4x4 world->world rigid transform: rotate about ``center_world``, then translate.

    ``p' = R @ (p - c) + c + t`` with ``R = Rz @ Ry @ Rx`` (rotation about the world x (R),
    then y (A), then z (S) axis, angles in degrees, right-handed; scipy's extrinsic "xyz").
    """
    r = Rotation.from_euler("xyz", np.asarray(rotation_deg, dtype=np.float64), degrees=True).as_matrix()
    c = np.asarray(center_world, dtype=np.float64)
    m = np.eye(4)
    m[:3, :3] = r
    m[:3, 3] = c - r @ c + np.asarray(translation_mm, dtype=np.float64)
    return m


def rigid_params(matrix: np.ndarray, center_world: Sequence[float] = (0.0, 0.0, 0.0)) -> dict:
    """Inverse of ``rigid_matrix``: rotation angles (deg, "xyz") and translation (mm) about ``c``."""
    m = np.asarray(matrix, dtype=np.float64)
    c = np.asarray(center_world, dtype=np.float64)
    angles = Rotation.from_matrix(m[:3, :3]).as_euler("xyz", degrees=True)
    t = m[:3, 3] - c + m[:3, :3] @ c
    return {"rotation_deg": [float(a) for a in angles], "translation_mm": [float(v) for v in t],
            "center_world": [float(v) for v in c]}


def move_image(image: Image, matrix: np.ndarray, order: int = 1) -> Image:
    """The same grid with its content moved by world->world ``matrix`` (see module docstring).

    Content that leaves the grid is lost; uncovered voxels become 0. Masks are moved with
    nearest-neighbour interpolation regardless of ``order``.
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape != (4, 4):
        raise ToolError(ErrorCode.shape, f"motion matrix must be 4x4, got {m.shape}", arg="matrix")
    # The moved image equals the original array placed on affine M @ A, resampled back on A.
    is_mask = isinstance(image, Mask)
    data = sample_on_grid(np.asarray(image.data), m @ image.affine, image.affine, image.shape,
                          order=0 if is_mask else order)
    meta = dict(image.meta, moved_by=m.tolist())
    return replace(image, data=data, affine=np.array(image.affine, dtype=np.float64), meta=meta)


def downsample_through_plane(image: Image, factor: int, axis: int = 2) -> Image:
    """Thick-slice version of ``image``: each output slice averages ``factor`` input slices.

    Trailing slices that do not fill a whole slab are dropped. The output affine is exact:
    axis ``axis`` is ``factor`` times longer and output voxel 0 sits at the centre of input
    slices ``0 .. factor-1`` (index ``(factor - 1) / 2``), so the volume stays in register.
    """
    if factor < 1 or axis not in (0, 1, 2):
        raise ToolError(ErrorCode.value_range, f"need factor >= 1 and axis in 0..2, got "
                        f"factor={factor} axis={axis}", arg="factor")
    data = np.asarray(image.data, dtype=np.float32)
    n = data.shape[axis] // factor
    if n < 1:
        raise ToolError(ErrorCode.shape, f"axis {axis} has {data.shape[axis]} slices, fewer than "
                        f"the factor {factor}", arg="factor")
    moved = np.moveaxis(data, axis, 0)[: n * factor]
    slabs = moved.reshape((n, factor) + moved.shape[1:]).mean(axis=1)
    out = np.moveaxis(slabs, 0, axis).astype(np.float32)
    s = np.eye(4)
    s[axis, axis] = float(factor)
    s[axis, 3] = (factor - 1) / 2.0
    affine = np.asarray(image.affine, dtype=np.float64) @ s
    meta = dict(image.meta, downsampled={"factor": int(factor), "axis": int(axis)})
    return Image(out, affine, meta)
