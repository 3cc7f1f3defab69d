"""Registered ``io.*`` tools: load NIfTI / DICOM / fastMRI / CMRxRecon, save NIfTI.

They wrap the readers and writers of ``bcer.io`` so a plan can load a file that is not
one of the case's sequences, or write an intermediate result. Every path parameter is named
``path`` or ``*_path`` because the executor sandboxes params by those names; the tools
themselves never resolve paths against anything but what they are given.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..contracts.artifacts import Cine, Image, KSpace, Mask, Table
from ..contracts.errors import ErrorCode, ToolError
from ..io import cmrx, dicom, fastmri
from ..io.nifti import read_nifti, write_nifti
from .registry import tool

log = logging.getLogger(__name__)


class PathParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, description="file to read (sandboxed to the case's input root)")


class MaskLoadParams(PathParams):
    labels: dict[int, str] = Field(default_factory=dict, description="name of each label value")


class DicomParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, description="folder (or file) of one DICOM series")
    series_uid: str | None = Field(None, description="SeriesInstanceUID when the folder holds several")


class CmrxParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, description="CMRxRecon .mat (v7.3) k-space file")
    variable: str | None = Field(None, description="k-space variable (kspace_full, kspace_sub04...); auto if None")
    mask_path: str | None = Field(None, description="separate *_mask.mat file, if any")
    mask_variable: str | None = Field(None, description="mask variable (mask04...); auto if None")


class SaveParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1, description="output .nii or .nii.gz (sandboxed to the case's output folder)")


@tool("io.load_nifti", version="1.0", resources={"num_cpus": 1, "memory_mb": 1024})
def load_nifti(params: PathParams) -> Image:
    """Load a 3-D NIfTI image with its affine (float32).

    Raises:
        ToolError: ``input_missing`` (no file), ``schema`` (not NIfTI), ``shape`` (not 3-D), ``numeric``.
    """
    return read_nifti(params.path, "image", expect_ndim=3)


@tool("io.load_nifti_mask", version="1.0", resources={"num_cpus": 1, "memory_mb": 1024})
def load_nifti_mask(params: MaskLoadParams) -> Mask:
    """Load a NIfTI label map as a Mask (int16 labels, affine kept)."""
    mask = read_nifti(params.path, "mask", labels=params.labels)
    if mask.data.ndim != 3:
        raise ToolError(ErrorCode.shape, f"{Path(params.path).name} has shape {mask.data.shape}; "
                        "expected a 3-D label map", file=params.path)
    return mask


@tool("io.load_nifti_cine", version="1.0", resources={"num_cpus": 1, "memory_mb": 2048})
def load_nifti_cine(params: PathParams) -> Cine:
    """Load a 4-D NIfTI (X, Y, Z, T) as a Cine."""
    return read_nifti(params.path, "image", expect_ndim=4)


@tool("io.load_dicom", version="1.0", resources={"num_cpus": 1, "memory_mb": 1024})
def load_dicom(params: DicomParams) -> Image:
    """Load one DICOM MR series as an Image with its RAS affine (from the LPS patient geometry)."""
    return dicom.read_series(params.path, params.series_uid)


@tool("io.load_fastmri", version="1.0", resources={"num_cpus": 1, "memory_mb": 4096})
def load_fastmri(params: PathParams) -> KSpace:
    """Load the multi-coil k-space (C, X, Y, Z) and sampling mask of a fastMRI ``.h5`` file."""
    return fastmri.read_fastmri(params.path)


@tool("io.load_fastmri_reference", version="1.0", resources={"num_cpus": 1, "memory_mb": 1024})
def load_fastmri_reference(params: PathParams) -> Image:
    """Load the ``reconstruction_rss`` reference image of a fastMRI ``.h5`` file."""
    return fastmri.read_fastmri_reference(params.path)


@tool("io.load_cmrx", version="1.0", resources={"num_cpus": 1, "memory_mb": 4096})
def load_cmrx(params: CmrxParams) -> KSpace:
    """Load CMRxRecon ``.mat`` k-space (C, X, Y, Z[, T]) with its mask."""
    return cmrx.read_cmrx_kspace(params.path, params.variable, params.mask_path, params.mask_variable)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@tool("io.save_nifti", version="1.0", output="saved", resources={"num_cpus": 1, "memory_mb": 1024})
def save_nifti(params: SaveParams, image: Image | None = None, mask: Mask | None = None,
               cine: Cine | None = None) -> Table:
    """Write exactly one of ``image``/``mask``/``cine`` as NIfTI (atomic, affine in sform and qform).

    Returns:
        A one-row Table ``saved_files``: path, kind, shape, spacing, orientation, sha256.

    Raises:
        ToolError: ``input_missing`` (nothing to save), ``schema`` (more than one input).
    """
    given = [(n, a) for n, a in (("image", image), ("mask", mask), ("cine", cine)) if a is not None]
    if not given:
        raise ToolError(ErrorCode.input_missing, "io.save_nifti needs one of image, mask, cine", arg="image")
    if len(given) > 1:
        raise ToolError(ErrorCode.schema, f"io.save_nifti saves one artifact per call, got {[n for n, _ in given]}",
                        arg=given[1][0])
    name, art = given[0]
    if not np.all(np.isfinite(np.asarray(art.data, dtype=np.float64))):
        raise ToolError(ErrorCode.numeric, f"{name} has NaN/Inf values; refusing to write it", arg=name)
    out = write_nifti(art, params.path)
    row = {"path": str(out), "kind": name, "shape": list(np.shape(art.data)),
           "spacing": [float(v) for v in art.spacing], "orientation": art.orientation, "sha256": _sha256(out)}
    log.debug("io.save_nifti wrote %s", out)
    return Table([row], units={"spacing": "mm"}, name="saved_files")
