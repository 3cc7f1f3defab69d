"""Phantom geometry helpers: voxel grids with realistic (oblique, flipped, anisotropic) affines.

Every phantom generator builds its anatomy in world space (RAS+ mm) and samples it onto a
grid made here, so that tools which ignore the affine give measurably wrong answers.

Conventions (NIfTI, as in ``bcer.contracts.artifacts``): an affine ``A`` maps voxel indices
``(i, j, k, 1)`` to world ``(x, y, z, 1)`` in RAS+ millimetres, voxel centres at integer
indices. ``A[:3, :3] = direction @ diag(spacing)``: column ``c`` of ``direction`` is the unit
world direction in which array axis ``c`` increases.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from scipy import ndimage
from scipy.spatial.transform import Rotation

log = logging.getLogger(__name__)

__all__ = ["world_coords", "random_direction", "make_affine", "sample_on_grid", "grid_center",
           "voxel_to_voxel"]


def world_coords(affine: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """World (RAS mm) coordinates of every voxel centre.

    Args:
        affine: 4x4 voxel-to-world matrix.
        shape: the grid's (X, Y, Z) shape (extra trailing dims are ignored).

    Returns:
        float64 array of shape (X, Y, Z, 3).

    >>> world_coords(np.diag([2., 2., 2., 1.]), (2, 1, 1))[:, 0, 0]
    array([[0., 0., 0.],
           [2., 0., 0.]])
    """
    a = np.asarray(affine, dtype=np.float64)
    ijk = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float64) for n in shape[:3]],
                               indexing="ij"), axis=-1)
    return ijk @ a[:3, :3].T + a[:3, 3]


def random_direction(rng: np.random.Generator, oblique_deg: float = 12.0, flips: bool = True,
                     permute: bool = False) -> np.ndarray:
    """A random 3x3 orthonormal direction matrix like those of real scanner NIfTI files.

    Starts from the identity (array axes along R, A, S), optionally permutes the axes (e.g.
    a coronal or sagittal acquisition), rotates by a random angle in ``[0.3, 1] * oblique_deg``
    about a random axis (an oblique slice plane), and flips each axis with probability 1/2
    (at least one flip when ``flips`` so the grid is never the identity orientation).

    Returns:
        3x3 float64 matrix with orthonormal columns and determinant +1 or -1.
    """
    d = np.eye(3)
    if permute:
        d = d[:, rng.permutation(3)]
    if oblique_deg > 0:
        axis = rng.normal(size=3)
        axis /= np.linalg.norm(axis)
        angle = np.deg2rad(oblique_deg) * rng.uniform(0.3, 1.0)
        d = Rotation.from_rotvec(axis * angle).as_matrix() @ d
    if flips:
        signs = rng.choice([-1.0, 1.0], size=3)
        if np.all(signs > 0):
            signs[rng.integers(3)] = -1.0
        d = d * signs[None, :]
    return d


def make_affine(direction: np.ndarray, spacing: Sequence[float], shape: Sequence[int],
                center_world: Sequence[float] = (0.0, 0.0, 0.0)) -> np.ndarray:
    """4x4 affine of a grid with the given axes and voxel size, centred on ``center_world``.

    The centre of the grid (index ``(shape - 1) / 2``) maps exactly to ``center_world``.
    """
    d = np.asarray(direction, dtype=np.float64)
    a = np.eye(4)
    a[:3, :3] = d * np.asarray(spacing, dtype=np.float64)[None, :]
    mid = (np.asarray(shape[:3], dtype=np.float64) - 1.0) / 2.0
    a[:3, 3] = np.asarray(center_world, dtype=np.float64) - a[:3, :3] @ mid
    return a


def grid_center(affine: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """World coordinates of the grid centre (inverse of ``make_affine``'s centring)."""
    a = np.asarray(affine, dtype=np.float64)
    mid = (np.asarray(shape[:3], dtype=np.float64) - 1.0) / 2.0
    return a[:3, :3] @ mid + a[:3, 3]


def voxel_to_voxel(src_affine: np.ndarray, dst_affine: np.ndarray) -> np.ndarray:
    """4x4 matrix mapping destination voxel indices to source voxel indices."""
    return np.linalg.inv(np.asarray(src_affine, dtype=np.float64)) @ np.asarray(dst_affine, np.float64)


def sample_on_grid(src: np.ndarray, src_affine: np.ndarray, dst_affine: np.ndarray,
                   dst_shape: Sequence[int], order: int = 1, cval: float = 0.0) -> np.ndarray:
    """Resample ``src`` (on ``src_affine``) at the voxel centres of a destination grid.

    Both grids live in the same world space; a destination voxel takes the value of ``src``
    at the same world point (interpolated with spline ``order``; 0 for label maps). Points
    outside ``src`` get ``cval``. Trailing axes beyond the third (time) are resampled
    independently.

    Args:
        src: (X, Y, Z) or (X, Y, Z, ...) array.
        src_affine, dst_affine: 4x4 voxel-to-world matrices.
        dst_shape: (X, Y, Z) of the destination grid.
        order: spline order (0 nearest, 1 linear, 3 cubic).
        cval: fill value outside ``src``.

    Returns:
        Array of shape ``dst_shape[:3] + src.shape[3:]``; dtype of ``src`` for ``order=0``,
        float32 otherwise.
    """
    src = np.asarray(src)
    m = voxel_to_voxel(src_affine, dst_affine)
    out_shape = tuple(int(n) for n in dst_shape[:3])
    if src.ndim > 3:
        flat = src.reshape(src.shape[:3] + (-1,))
        parts = [sample_on_grid(flat[..., t], src_affine, dst_affine, out_shape, order, cval)
                 for t in range(flat.shape[-1])]
        return np.stack(parts, axis=-1).reshape(out_shape + src.shape[3:])
    work = src if order == 0 else src.astype(np.float32, copy=False)
    # affine_transform does what map_coordinates does for an affine index map, without
    # materialising the (3, X, Y, Z) coordinate array.
    out = ndimage.affine_transform(work, m[:3, :3], offset=m[:3, 3], output_shape=out_shape,
                                   order=order, mode="constant", cval=cval,
                                   prefilter=order > 1)
    return out if order == 0 else out.astype(np.float32, copy=False)
