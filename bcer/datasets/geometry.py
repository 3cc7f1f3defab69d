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
from scipy.spatial.transform import Rotation

log = logging.getLogger(__name__)

__all__ = ["world_coords", "random_direction", "make_affine", "grid_center"]


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
