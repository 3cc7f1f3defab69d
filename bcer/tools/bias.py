"""N4 bias-field correction (SimpleITK N4BiasFieldCorrectionImageFilter).

N4 is fitted on a shrunk copy (speed), then the fitted log-field is evaluated on the full
grid and divided out, so the output keeps the input's resolution and geometry.
"""
from __future__ import annotations

import logging

import numpy as np
import SimpleITK as sitk
from pydantic import BaseModel, ConfigDict, Field

from ..contracts.artifacts import Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from ..io.sitk_bridge import from_sitk, to_sitk
from ._checks import require_nonempty, require_same_grid, require_volume
from .registry import tool

log = logging.getLogger(__name__)


class N4Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shrink_factor: int = Field(2, ge=1, le=8, description="downsampling of the fitting copy (speed)")
    iterations: int = Field(50, ge=1, le=500, description="max iterations per fitting level")
    levels: int = Field(3, ge=1, le=8, description="fitting levels (B-spline control grid doubles each level)")
    control_points: int = Field(4, ge=4, le=32, description="initial B-spline control points per axis")
    convergence: float = Field(1e-4, gt=0.0, le=0.1, description="convergence threshold per level")


def _otsu_mask(img: sitk.Image) -> sitk.Image:
    # Otsu separates head from air; N4 must not fit the field to background noise.
    return sitk.OtsuThreshold(img, 0, 1, 200)


def correct_bias(data: np.ndarray, affine: np.ndarray, params: N4Params, mask: np.ndarray | None = None,
                 shrink: tuple[int, int, int] | None = None) -> tuple[np.ndarray, dict]:
    """N4-correct a 3-D array: fitted inside ``mask`` (else an Otsu foreground) on a copy
    shrunk by ``shrink`` per axis (else ``params.shrink_factor``); returns the corrected
    float32 array and what was done (the record ``bias.n4`` keeps in its meta)."""
    if not np.any(data > 0):
        raise ToolError(ErrorCode.value_range, "image has no positive voxels to correct", arg="image")
    # N4 models log-intensities: clip negatives (noise, interpolation ringing) to 0.
    full = to_sitk(np.clip(data, 0.0, None).astype(np.float32), affine)
    full_mask = _otsu_mask(full) if mask is None else to_sitk(np.asarray(mask, np.uint8), affine)
    factors = [int(v) for v in (shrink or [params.shrink_factor] * 3)]
    small, small_mask = sitk.Shrink(full, factors), sitk.Shrink(full_mask, factors)
    f = sitk.N4BiasFieldCorrectionImageFilter()
    f.SetMaximumNumberOfIterations([params.iterations] * params.levels)
    f.SetNumberOfControlPoints([params.control_points] * 3)
    f.SetConvergenceThreshold(params.convergence)
    f.Execute(small, small_mask)
    log_f, _ = from_sitk(f.GetLogBiasFieldAsImage(full))
    inside = from_sitk(full_mask)[0] > 0
    # N4's field has an arbitrary scale; fixing its geometric mean inside the mask to 1 keeps
    # the corrected intensities in the input's units.
    field = np.exp(log_f - log_f[inside].mean()).astype(np.float32)
    out = (np.asarray(data, dtype=np.float32) / field).astype(np.float32)
    return out, {"method": "sitk.N4", "mask": "given" if mask is not None else "otsu",
                 "shrink_factor": factors if shrink else params.shrink_factor, "levels": params.levels,
                 "iterations": params.iterations, "field_min": float(field[inside].min()),
                 "field_max": float(field[inside].max()), "iterations_last_level": int(f.GetElapsedIterations())}


@tool("bias.n4", version="1.0", milestone="bias_correction", resources={"num_cpus": 1, "memory_mb": 2048})
def n4(image: Image, params: N4Params, mask: Mask | None = None) -> Image:
    """N4 bias-field correction of a 3-D image (fitted inside ``mask``, or an Otsu foreground).

    Args:
        image: the 3-D image with a smooth multiplicative shading.
        params: shrink factor, iterations per level, levels, control points, convergence.
        mask: optional region to fit in (same grid as ``image``); Otsu foreground when absent.

    Returns:
        The corrected image (float32, same grid); meta records the field range and settings.

    Raises:
        ToolError: ``shape`` (not 3-D, mask off-grid), ``numeric`` (NaN/Inf),
            ``value_range`` (params, empty mask, no positive voxels).
    """
    data = require_volume(image, "image")
    if mask is not None:
        require_same_grid(image, mask, "image", "mask")
        require_nonempty(mask, "mask")
    out, record = correct_bias(data, image.affine, params, None if mask is None else np.asarray(mask.data) > 0)
    meta = dict(image.meta, bias_correction=record)
    log.debug("bias.n4 %s", meta["bias_correction"])
    return Image(out.astype(np.float32), np.array(image.affine, dtype=np.float64), meta)
