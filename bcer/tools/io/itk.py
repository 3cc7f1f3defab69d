"""MetaImage (``.mha``/``.mhd``) and NRRD volumes through SimpleITK, with the exact geometry.

ITK keeps geometry in LPS: voxel index ``(i, j, k)`` sits at ``origin + D @ diag(spacing) @ (i, j, k)``
with ``D`` the direction matrix (columns: the axis directions). bcer works in RAS, so the
affine is ``diag(-1, -1, 1, 1) @ [[D @ diag(spacing), origin], [0, 1]]``. ``GetArrayFromImage``
returns (z, y, x); bcer arrays are (X, Y, Z), so the array is transposed.

PI-CAI ships its images as ``.mha`` (ADC in 10^-6 mm^2/s, the unit bcer's ADC tools use).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...contracts.artifacts import Image, Mask
from ...contracts.errors import ErrorCode, ToolError

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
SUFFIXES = (".mha", ".mhd", ".nrrd", ".nhdr")

__all__ = ["SUFFIXES", "is_itk_file", "itk_affine", "read_header", "read_itk", "read_sequence"]


def is_itk_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in SUFFIXES


def itk_affine(direction: Any, spacing: Any, origin: Any) -> np.ndarray:
    """The RAS affine of an ITK image's (flat 3x3 direction, spacing, origin)."""
    d = np.asarray(direction, dtype=np.float64).reshape(3, 3)
    lps = np.eye(4)
    lps[:3, :3] = d @ np.diag(np.asarray(spacing, dtype=np.float64))
    lps[:3, 3] = np.asarray(origin, dtype=np.float64)
    return LPS_TO_RAS @ lps


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
            "affine": itk_affine(r.GetDirection(), r.GetSpacing(), r.GetOrigin()),
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
    affine = itk_affine(img.GetDirection(), img.GetSpacing(), img.GetOrigin())
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
