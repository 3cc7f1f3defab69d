"""Resampling onto a new voxel size or onto another image's grid: the one resampling module.

Two kernels, each for what it does best, used by tools, datasets, engine and bench alike:
``resample_onto`` (SimpleITK; a registration transform, B-spline, nearest-voxel extrapolation)
and ``sample_on_grid`` (scipy; affines only, any spline order, a fill value, time axes kept,
the array's dtype kept), with ``resample_to`` for artifacts on artifacts.

``resample.to_spacing`` is the super-resolution step: it keeps the orientation and the
physical extent covered by the voxels (the box between the outer voxel faces) and makes the
output spacing exactly the one asked for. When the old extent is not a whole number of new
voxels, the new grid is centred in the old box (the remainder is split between both ends).
Its default method inverts the thick-slice acquisition (each thick voxel is the mean of the
thin voxels it covers) instead of interpolating slab values as if they were point samples.
"""
from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, Sequence

import numpy as np
import SimpleITK as sitk
from pydantic import BaseModel, ConfigDict, Field
from scipy import ndimage

from ..contracts.artifacts import Image
from ..contracts.errors import ErrorCode, ToolError
from ..io.sitk_bridge import INTERPOLATORS, from_sitk, reference_grid, to_sitk
from ._checks import require_ndim, require_volume
from .registry import tool

log = logging.getLogger(__name__)

Interpolator = Literal["bspline", "linear", "nearest"]
SpacingMethod = Literal["slab", "bspline", "linear", "nearest"]
Millimetres = Annotated[float, Field(ge=0.05, le=20.0)]


class ToSpacingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spacing: tuple[Millimetres, Millimetres, Millimetres] | None = Field(
        None, description="target voxel size in mm along each array axis (X, Y, Z)")
    factor: int | None = Field(None, ge=2, le=16, description="instead of spacing: divide the "
                               "spacing of the coarsest (slice) axis by this factor")
    interpolator: SpacingMethod = Field(
        "slab", description="slab: slab-consistent inversion along every axis made finer (each input "
                            "voxel is the mean of the output voxels it covers; the smoothest such volume), "
                            "B-spline on the others; or plain bspline (cubic), linear or nearest sampling")


def _target_spacing(current: tuple[float, float, float], p: ToSpacingParams) -> tuple[float, float, float]:
    """The spacing asked for: explicit, by through-plane factor, or isotropic at the finest axis."""
    if p.spacing is not None and p.factor is not None:
        raise ToolError(ErrorCode.value_range, "give either spacing or factor, not both",
                        hint="spacing for a known target grid, factor for N-times thinner slices", arg="factor")
    if p.spacing is not None:
        return tuple(float(v) for v in p.spacing)  # type: ignore[return-value]
    if p.factor is not None:
        out = list(current)
        axis = int(np.argmax(current))
        out[axis] = current[axis] / p.factor
        return tuple(out)  # type: ignore[return-value]
    return (min(current),) * 3


class ToGridParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interpolator: Interpolator = Field("linear", description="bspline (cubic), linear or nearest")


def target_grid(affine: np.ndarray, shape: tuple[int, ...],
                spacing: tuple[float, float, float]) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(affine, shape) of the grid with ``spacing`` covering the same box as (affine, shape)."""
    a = np.asarray(affine, dtype=np.float64)
    old_sp = np.linalg.norm(a[:3, :3], axis=0)
    new_sp = np.asarray(spacing, dtype=np.float64)
    extent = old_sp * np.asarray(shape[:3], dtype=np.float64)
    new_shape = np.maximum(np.rint(extent / new_sp), 1).astype(int)
    direction = a[:3, :3] / old_sp
    # In old-voxel units: the box starts at index -0.5; the new first centre sits half a new
    # voxel inside it, shifted by half of whatever the whole new voxels leave uncovered.
    start = -0.5 + (new_sp / 2.0 + (extent - new_shape * new_sp) / 2.0) / old_sp
    out = np.eye(4)
    out[:3, :3] = direction * new_sp
    out[:3, 3] = a[:3, :3] @ start + a[:3, 3]
    return out, tuple(int(n) for n in new_shape)


def resample_onto(data: np.ndarray, affine: np.ndarray, grid_affine: np.ndarray,
                  grid_shape: tuple[int, ...], interpolator: str,
                  transform: sitk.Transform | None = None, default: float = 0.0) -> np.ndarray:
    """``data`` (on ``affine``) sampled at the voxel centres of the target grid.

    ``transform`` maps target-grid world points to source world points (ITK direction).
    Outside the source, values are extended from the nearest voxel when no transform is given
    (resampling the same box must not darken its borders), else set to ``default``.
    """
    src = to_sitk(np.asarray(data, dtype=np.float32), affine)
    f = sitk.ResampleImageFilter()
    f.SetReferenceImage(reference_grid(grid_shape, grid_affine))
    f.SetInterpolator(INTERPOLATORS[interpolator])
    f.SetOutputPixelType(sitk.sitkFloat32)
    f.SetDefaultPixelValue(float(default))
    if transform is not None:
        f.SetTransform(transform)
    else:
        f.SetUseNearestNeighborExtrapolator(True)
    out, _ = from_sitk(f.Execute(src))
    return out


def sample_on_grid(src: np.ndarray, src_affine: np.ndarray, dst_affine: np.ndarray,
                   dst_shape: Sequence[int], order: int = 1, cval: float = 0.0,
                   dtype: Any = np.float32) -> np.ndarray:
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
        dtype: the working and output dtype for ``order > 0``.

    Returns:
        Array of shape ``dst_shape[:3] + src.shape[3:]``; dtype of ``src`` for ``order=0``,
        ``dtype`` otherwise.
    """
    src = np.asarray(src)
    m = np.linalg.inv(np.asarray(src_affine, dtype=np.float64)) @ np.asarray(dst_affine, np.float64)
    out_shape = tuple(int(n) for n in dst_shape[:3])
    if src.ndim > 3:
        flat = src.reshape(src.shape[:3] + (-1,))
        parts = [sample_on_grid(flat[..., t], src_affine, dst_affine, out_shape, order, cval, dtype)
                 for t in range(flat.shape[-1])]
        return np.stack(parts, axis=-1).reshape(out_shape + src.shape[3:])
    work = src if order == 0 else src.astype(dtype, copy=False)
    # affine_transform does what map_coordinates does for an affine index map, without
    # materialising the (3, X, Y, Z) coordinate array.
    out = ndimage.affine_transform(work, m[:3, :3], offset=m[:3, 3], output_shape=out_shape,
                                   order=order, mode="constant", cval=cval,
                                   prefilter=order > 1)
    return out if order == 0 else out.astype(dtype, copy=False)


def resample_to(moving: Any, target: Any, order: int = 1) -> np.ndarray:
    """``moving``'s data sampled at ``target``'s voxel centres through world coordinates
    (affines only, no registration); outside the moving field of view is 0. float64."""
    return sample_on_grid(np.asarray(moving.data, np.float64), moving.affine, target.affine,
                          np.shape(target.data)[:3], order=order, dtype=np.float64)


def slab_matrix(n_lo: int, positions: np.ndarray, width: float) -> np.ndarray:
    """(n_lo, n_hi) weights: row k averages the thin voxels inside thick voxel k.

    ``positions`` are the thin voxel centres and ``width`` their length, both in thick-voxel
    index units (thick voxel k spans [k - 0.5, k + 0.5]). A thin voxel straddling two slabs
    counts in each by its overlap; a slab the thin grid only partly covers (its extent is
    rounded to whole thin voxels) averages what it covers.
    """
    k = np.arange(n_lo, dtype=np.float64)[:, None]
    lo, hi = positions[None, :] - width / 2.0, positions[None, :] + width / 2.0
    overlap = np.clip(np.minimum(k + 0.5, hi) - np.maximum(k - 0.5, lo), 0.0, None)
    return overlap / np.maximum(overlap.sum(axis=1, keepdims=True), 1e-12)


def slab_inverse_matrix(n_lo: int, positions: np.ndarray, width: float) -> np.ndarray:
    """(n_hi, n_lo) linear map from thick-slab values to the smoothest consistent thin profile.

    Solves min sum_j (x[j+1] - x[j])^2 subject to ``slab_matrix @ x == y`` (exact slab means)
    through its KKT system: the first-difference energy keeps edges where the slabs put them
    without the overshoot of a cubic interpolant, and the constraint undoes the slab blur that
    plain interpolation of slab values leaves.
    """
    a = slab_matrix(n_lo, positions, width)
    n = a.shape[1]
    d = np.diff(np.eye(n), axis=0)
    kkt = np.block([[d.T @ d, a.T], [a, np.zeros((n_lo, n_lo))]])
    rhs = np.vstack([np.zeros((n, n_lo)), np.eye(n_lo)])
    sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    return sol[:n]


def slab_upsample(data: np.ndarray, affine: np.ndarray,
                  spacing: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """``data`` refined by slab inversion along every axis whose target spacing is finer.

    Returns the volume and its affine: the grid of :func:`target_grid` with the target spacing
    on the refined axes and the old spacing (and voxels) on the others.
    """
    a = np.asarray(affine, dtype=np.float64)
    old = np.linalg.norm(a[:3, :3], axis=0)
    new = np.asarray(spacing, dtype=np.float64)
    finer = new < old * (1.0 - 1e-6)
    mid_affine, mid_shape = target_grid(a, data.shape, tuple(np.where(finer, new, old)))
    out = np.asarray(data, dtype=np.float64)
    for axis in np.flatnonzero(finer):
        n_lo, n_hi, r = out.shape[axis], mid_shape[axis], float(new[axis] / old[axis])
        # thin centres in thick-index units, as target_grid places them (remainder split)
        positions = -0.5 + (r / 2.0 + (n_lo - n_hi * r) / 2.0) + np.arange(n_hi) * r
        m = slab_inverse_matrix(n_lo, positions, r)
        out = np.moveaxis(np.tensordot(m, np.moveaxis(out, axis, 0), axes=1), 0, axis)
    return out.astype(np.float32), mid_affine


@tool("resample.to_spacing", version="1.1", milestone="super_resolution",
      resources={"num_cpus": 1, "memory_mb": 1024})
def to_spacing(image: Image, params: ToSpacingParams) -> Image:
    """Resample an image to a target voxel spacing (slab inversion, B-spline, linear or nearest).

    Keeps orientation and the physical extent covered by the voxels; the output spacing is
    exactly the target: ``params.spacing``, or the slice axis divided by ``params.factor``,
    or (neither given) isotropic at the finest current spacing.

    ``interpolator="slab"`` (the default) treats each input voxel as the average of the output
    voxels it covers along every axis made finer (the thick-slice acquisition model: a slab
    profile the width of the slice spacing) and returns, along each such axis, the smoothest
    profile (least first-difference energy) whose slab averages reproduce the input exactly;
    axes kept or made coarser are then B-spline resampled. On 4x thick-slice phantoms this
    gains about twice the PSNR over nearest neighbour that B-spline interpolation does.

    Args:
        image: the 3-D image (e.g. thick-slice acquisition).
        params: target spacing (mm) or through-plane factor, and interpolator.

    Returns:
        The resampled image on the new grid (float32), meta recording the old/new grid.

    Raises:
        ToolError: ``shape`` (not 3-D), ``numeric`` (NaN/Inf), ``value_range`` (spacing,
            factor, or both given).
    """
    data = require_volume(image, "image")
    spacing = _target_spacing(image.spacing, params)
    affine, shape = target_grid(image.affine, data.shape, spacing)
    if params.interpolator == "slab":
        out, mid_affine = slab_upsample(data, image.affine, spacing)
        method = "slab_inverse(min first difference, exact slab means)"
        if out.shape != shape or not np.allclose(mid_affine, affine, atol=1e-9):
            out = resample_onto(out, mid_affine, affine, shape, "bspline")
            method += " + sitk.bspline"
    else:
        out = resample_onto(data, image.affine, affine, shape, params.interpolator)
        method = f"sitk.{params.interpolator}"
    log.debug("resample.to_spacing %s -> %s (%s)", data.shape, shape, method)
    meta = dict(image.meta, resampled={"method": method,
                                       "from_spacing": list(image.spacing), "to_spacing": list(spacing),
                                       "from_shape": list(data.shape), "to_shape": list(shape)})
    return Image(out, affine, meta)


@tool("resample.to_grid", version="1.0", milestone="resampling",
      resources={"num_cpus": 1, "memory_mb": 1024})
def to_grid(image: Image, reference: Image, params: ToGridParams) -> Image:
    """Resample an image onto another image's voxel grid (same world space, no transform).

    Args:
        image: the 3-D image to resample.
        reference: the image whose grid (shape + affine) the output takes; its values are unused.
        params: interpolator.

    Returns:
        ``image`` sampled at the voxel centres of ``reference`` (float32); zero outside ``image``.
    """
    data = require_volume(image, "image")
    require_ndim(reference, 3, "reference")
    ref_shape = tuple(np.shape(reference.data))
    out = resample_onto(data, image.affine, reference.affine, ref_shape, params.interpolator,
                        transform=sitk.Transform(3, sitk.sitkIdentity))
    meta = dict(image.meta, resampled={"method": f"sitk.{params.interpolator}", "onto": "reference grid"})
    return Image(out, np.array(reference.affine, dtype=np.float64), meta)
