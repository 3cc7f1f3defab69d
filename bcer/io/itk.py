"""MetaImage (``.mha``/``.mhd``) and NRRD volumes through SimpleITK, with the exact geometry.

ITK keeps geometry in LPS and arrays as (z, y, x); the conversion to bcer's RAS affine and
(X, Y, Z) arrays is ``sitk_bridge``'s, the one place that knows both conventions.

PI-CAI ships its images as ``.mha`` (ADC in 10^-6 mm^2/s, the unit bcer's ADC tools use).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.artifacts import Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from .sitk_bridge import affine_from_geometry, to_sitk

SUFFIXES = (".mha", ".mhd", ".nrrd", ".nhdr")

__all__ = ["SUFFIXES", "is_itk_file", "read_header", "read_itk", "read_sequence", "write_itk"]


def is_itk_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in SUFFIXES


def _reader(path: Path):
    import SimpleITK as sitk

    if not path.exists():
        raise ToolError(ErrorCode.input_missing, f"file not found: {path}", file=str(path))
    r = sitk.ImageFileReader()
    r.SetFileName(str(path))
    return r


def _check_3d(dim: int, ncomp: int, path: Path) -> None:
    if dim != 3 or ncomp != 1:
        raise ToolError(ErrorCode.shape, f"{path.name} is a {dim}-D image with {ncomp} component(s); "
                        "expected one 3-D grey-level volume", file=str(path))


def read_header(path: str | Path) -> dict[str, Any]:
    """Shape (X, Y, Z), RAS affine and pixel type from the header only.

    Raises:
        ToolError: ``input_missing`` (no file), ``schema`` (unreadable), ``shape`` (not 3-D).
    """
    import SimpleITK as sitk

    path = Path(path)
    r = _reader(path)
    try:
        r.ReadImageInformation()
    except RuntimeError as e:
        raise ToolError(ErrorCode.schema, f"cannot read the header of {path.name}: {str(e).strip()[:200]}",
                        hint="the file is truncated or not a MetaImage/NRRD", file=str(path)) from e
    _check_3d(r.GetDimension(), r.GetNumberOfComponents(), path)
    return {"shape": tuple(int(n) for n in r.GetSize()),
            "affine": affine_from_geometry(r.GetOrigin(), r.GetSpacing(), r.GetDirection()),
            "dtype": sitk.GetPixelIDValueAsString(r.GetPixelID())}


def read_itk(path: str | Path, kind: str = "image", labels: dict[int, str] | None = None) -> Image | Mask:
    """Read a 3-D ``.mha``/``.nrrd`` as an Image (float32) or a Mask (int16).

    Raises:
        ToolError: ``input_missing``, ``schema`` (truncated/corrupt), ``shape`` (not 3-D, or
            several components), ``numeric`` (NaN/Inf voxels).
    """
    import SimpleITK as sitk

    path = Path(path)
    r = _reader(path)
    try:
        img = r.Execute()
    except RuntimeError as e:
        raise ToolError(ErrorCode.schema, f"cannot read {path.name}: {str(e).strip()[:200]}",
                        hint="the file is truncated or not a MetaImage/NRRD", file=str(path)) from e
    _check_3d(img.GetDimension(), img.GetNumberOfComponentsPerPixel(), path)
    data = np.ascontiguousarray(sitk.GetArrayFromImage(img).transpose(2, 1, 0))
    affine = affine_from_geometry(img.GetOrigin(), img.GetSpacing(), img.GetDirection())
    meta = {"source": str(path), "format": "itk"}
    if kind == "mask":
        return Mask(data.astype(np.int16), affine, meta, labels=dict(labels or {}))
    data = data.astype(np.float32, copy=False)
    if not np.all(np.isfinite(data)):
        raise ToolError(ErrorCode.numeric, f"{path.name} has NaN/Inf voxels", file=str(path))
    return Image(data, affine, meta)


def read_sequence(ref) -> Image | Mask:
    """SequenceRef reader for format ``itk``."""
    kind = ref.kind.value if hasattr(ref.kind, "value") else str(ref.kind)
    labels = {int(k): v for k, v in ref.options.get("labels", {}).items()}
    return read_itk(ref.path, "mask" if kind == "mask" else "image", labels)


def write_itk(artifact: Image, path: str | Path, compress: bool = True) -> Path:
    """Write a 3-D Image as ``.mha``/``.nrrd`` (float32) on its own grid."""
    import SimpleITK as sitk

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sitk.WriteImage(to_sitk(np.asarray(artifact.data), artifact.affine, np.float32), str(path), compress)
    return path
