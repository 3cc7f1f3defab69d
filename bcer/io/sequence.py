"""A case's sequence from its ``SequenceRef``: the reader each format has, and its header alone.

Each reader module defines ``read_sequence(ref)``; modules load on first use, so reading NIfTI
never imports SimpleITK, h5py or pydicom.
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..contracts.case import SequenceRef
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import orientation, spacing

# format -> module of bcer.io that defines ``read_sequence(ref: SequenceRef)``
SEQUENCE_READERS = {
    "nifti": "nifti",
    "nifti_frames": "nifti",
    "dicom": "dicom",
    "itk": "itk",  # .mha / .nrrd through SimpleITK
    "fastmri_h5": "fastmri",
    "cmrx_mat": "cmrx",
}

__all__ = ["SEQUENCE_READERS", "load_sequence", "sequence_header"]


def load_sequence(ref: SequenceRef) -> Any:
    """Load the artifact a SequenceRef points at (the lazy half of a dataset adapter)."""
    mod = SEQUENCE_READERS.get(ref.format)
    if mod is None:
        raise ToolError(ErrorCode.schema, f"unknown sequence format {ref.format!r}",
                        hint=f"valid: {sorted(SEQUENCE_READERS)}", file=ref.path)
    return importlib.import_module(f"{__package__}.{mod}").read_sequence(ref)


def sequence_header(ref: SequenceRef) -> dict[str, Any]:
    """Shape, spacing, orientation, affine and dtype of any SequenceRef; formats without a cheap
    header are loaded."""
    from .nifti import read_header

    if ref.format == "nifti":
        h = read_header(ref.path)
        if ref.options.get("channel") is not None:  # one channel of a 4-D multi-channel file (MSD)
            h["shape"] = tuple(h["shape"][:3])
        return h
    if ref.format == "nifti_frames" and ref.options.get("frames"):
        h = read_header(ref.options["frames"][0])
        h["shape"] = tuple(h["shape"][:3]) + (len(ref.options["frames"]),)
        return h
    if ref.format == "itk":  # .mha/.nrrd: SimpleITK reads the header alone
        from .itk import read_header as itk_header

        h = itk_header(ref.path)
        return {**h, "spacing": spacing(h["affine"]), "orientation": orientation(h["affine"])}
    art = load_sequence(ref)
    affine = np.asarray(art.affine, dtype=np.float64)
    shape = tuple(int(n) for n in getattr(art, "image_shape", np.shape(art.data)))
    return {"shape": shape, "spacing": spacing(affine), "orientation": orientation(affine),
            "affine": affine, "dtype": str(np.asarray(art.data).dtype)}
