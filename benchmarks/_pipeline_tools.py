"""The five user tools of the pipeline benchmark (issue 11): N4 -> CurvatureFlow -> resample 2 mm
-> two measurements. Plain user code: SimpleITK on a diagonal-affine grid, registered with
``@tool`` (importable by module name in Ray workers)."""
from __future__ import annotations

import numpy as np
import SimpleITK as sitk
from pydantic import BaseModel, ConfigDict, Field

from bcer.contracts import Image, Table
from bcer.tools.registry import tool

RES = {"num_cpus": 1, "memory_mb": 0}
sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)  # one core per task, as Ray schedules them


def _to_itk(img: Image) -> sitk.Image:
    a = np.asarray(img.affine, dtype=float)
    out = sitk.GetImageFromArray(np.ascontiguousarray(np.asarray(img.data, np.float32).transpose(2, 1, 0)))
    out.SetSpacing([float(abs(a[i, i])) for i in range(3)])
    out.SetOrigin([float(a[i, 3]) for i in range(3)])
    return out


def _from_itk(itk: sitk.Image) -> Image:
    a = np.eye(4)
    a[:3, :3] = np.diag(itk.GetSpacing())
    a[:3, 3] = itk.GetOrigin()
    return Image(sitk.GetArrayFromImage(itk).transpose(2, 1, 0).astype(np.float32), a)


class N4Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shrink: int = Field(4, ge=1, le=8)
    iterations: int = Field(10, ge=1, le=200)


class FlowParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    iterations: int = Field(5, ge=1, le=100)


class SpacingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spacing_mm: float = Field(2.0, gt=0, le=10)


class IntensityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    percentile: float = Field(95.0, ge=0, le=100)


def n4_step(img: Image, p: N4Params) -> Image:
    itk = _to_itk(img)
    mask = sitk.OtsuThreshold(itk, 0, 1, 200)
    small = sitk.Shrink(itk, [p.shrink] * 3)
    small_mask = sitk.Shrink(mask, [p.shrink] * 3)
    f = sitk.N4BiasFieldCorrectionImageFilter()
    f.SetMaximumNumberOfIterations([p.iterations] * 3)
    f.Execute(small, small_mask)
    log_bias = f.GetLogBiasFieldAsImage(itk)
    return _from_itk(itk / sitk.Exp(log_bias))


def smooth_step(img: Image, p: FlowParams) -> Image:
    return _from_itk(sitk.CurvatureFlow(_to_itk(img), timeStep=0.0625, numberOfIterations=p.iterations))


def resample_step(img: Image, p: SpacingParams) -> Image:
    itk = _to_itk(img)
    size = [max(1, int(round(n * s / p.spacing_mm))) for n, s in zip(itk.GetSize(), itk.GetSpacing())]
    out = sitk.Resample(itk, size, sitk.Transform(), sitk.sitkLinear, itk.GetOrigin(), [p.spacing_mm] * 3,
                        itk.GetDirection(), 0.0, sitk.sitkFloat32)
    return _from_itk(out)


def volume_step(img: Image) -> Table:
    itk = _to_itk(img)
    fg = sitk.GetArrayFromImage(sitk.OtsuThreshold(itk, 0, 1, 200))
    voxel_ml = float(np.prod(itk.GetSpacing())) / 1000.0
    return Table([{"volume_ml": float(fg.sum()) * voxel_ml, "voxels": int(fg.sum())}], units={"volume_ml": "ml"})


def intensity_step(img: Image, p: IntensityParams) -> Table:
    d = np.asarray(img.data, np.float64)
    return Table([{"mean": float(d.mean()), "std": float(d.std()), "p": float(np.percentile(d, p.percentile))}])


@tool("pipe.n4", resources=RES, milestone="bias_corrected")
def n4(img: Image, params: N4Params) -> Image:
    """N4 bias-field correction (SimpleITK) on a shrunken grid."""
    return n4_step(img, params)


@tool("pipe.smooth", resources=RES, milestone="smoothed")
def smooth(img: Image, params: FlowParams) -> Image:
    """Curvature-flow denoising (SimpleITK CurvatureFlow)."""
    return smooth_step(img, params)


@tool("pipe.resample", resources=RES, milestone="resampled")
def resample(img: Image, params: SpacingParams) -> Image:
    """Linear resampling to isotropic spacing."""
    return resample_step(img, params)


@tool("pipe.volume", resources=RES, milestone="volume")
def volume(img: Image) -> Table:
    """Foreground volume (Otsu) in ml."""
    return volume_step(img)


@tool("pipe.intensity", resources=RES, milestone="intensity")
def intensity(img: Image, params: IntensityParams) -> Table:
    """Mean, std and a percentile of the intensities."""
    return intensity_step(img, params)
