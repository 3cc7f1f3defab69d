"""Public conversions between bcer artifacts and SimpleITK / nibabel images, for user tools.

Every conversion keeps the geometry: an artifact's RAS affine becomes ITK's LPS origin,
spacing and direction and back, so a user tool that calls SimpleITK cannot lose the grid.

>>> import numpy as np
>>> from bcer import Image, to_sitk, from_sitk
>>> img = Image(np.zeros((4, 5, 6), np.float32), np.diag([2.0, 2.0, 3.0, 1.0]))
>>> back = from_sitk(to_sitk(img), like=img)
>>> back.data.shape, bool(np.allclose(back.affine, img.affine))
((4, 5, 6), True)
"""
from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from ..contracts.artifacts import Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from ..io.sitk_bridge import from_sitk as _from_sitk
from ..io.sitk_bridge import to_sitk as _to_sitk

A = TypeVar("A", Image, Mask)


def to_sitk(artifact: Image | Mask, pixel_type: Any | None = None) -> Any:
    """A ``SimpleITK.Image`` of a 3-D Image or Mask.

    Args:
        artifact: the volume (its affine becomes ITK origin, spacing and direction).
        pixel_type: a SimpleITK pixel id (``sitk.sitkFloat32``) or a numpy dtype; None keeps the data's.

    Raises:
        ToolError: ``shape`` for anything but a 3-D volume.
    """
    data = np.asarray(artifact.data)
    if data.ndim != 3:
        raise ToolError(ErrorCode.shape, f"to_sitk needs a 3-D volume, got shape {data.shape}",
                        hint="convert one frame at a time (Cine.frame(t))")
    if isinstance(pixel_type, int) and not isinstance(pixel_type, bool):  # a SimpleITK pixel id
        import SimpleITK as sitk

        return sitk.Cast(_to_sitk(data, np.asarray(artifact.affine)), pixel_type)
    return _to_sitk(data, np.asarray(artifact.affine), pixel_type)


def from_sitk(img: Any, like: A | None = None, kind: type[A] = Image, labels: dict[int, str] | None = None,
              **meta: Any) -> A:
    """An artifact from a 3-D ``SimpleITK.Image``; ``like`` copies its meta (and labels for a Mask).

    Args:
        img: the SimpleITK image.
        like: the artifact this one derives from (its meta is kept, updated with ``meta``).
        kind: ``Image`` or ``Mask`` when ``like`` is not given.
        labels: label names of a Mask (``{1: "foreground"}``).
    """
    data, affine = _from_sitk(img)
    cls = type(like) if like is not None else kind
    base_meta = dict(getattr(like, "meta", {}) or {})
    base_meta.pop("origin", None)  # the engine stamps where an output came from; a new artifact is new
    base_meta.update(meta)
    if cls is Mask:
        labels = dict(labels if labels is not None else getattr(like, "labels", {}) or {})
        return Mask(np.asarray(data).astype(np.int16, copy=False), affine, base_meta, labels=labels)  # type: ignore[return-value]
    return cls(np.asarray(data), affine, base_meta)


def to_nibabel(artifact: Image | Mask) -> Any:
    """A ``nibabel.Nifti1Image`` with the artifact's affine (any dimensionality)."""
    import nibabel as nib

    return nib.Nifti1Image(np.asarray(artifact.data), np.asarray(artifact.affine, np.float64))


def from_nibabel(img: Any, kind: type[A] = Image, **meta: Any) -> A:
    """An artifact from a nibabel image (data in memory, affine as stored)."""
    data = np.asarray(img.dataobj)
    if kind is Mask:
        return Mask(data.astype(np.int16, copy=False), np.asarray(img.affine), dict(meta))  # type: ignore[return-value]
    return kind(data, np.asarray(img.affine), dict(meta))


__all__ = ["from_nibabel", "from_sitk", "to_nibabel", "to_sitk"]
