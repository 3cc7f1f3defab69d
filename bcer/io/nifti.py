"""NIfTI read/write with the affine carried through exactly (nibabel)."""
from __future__ import annotations

import gzip
import itertools
import json
import os
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.artifacts import Cine, Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import orientation, spacing


_LABELS_ECODE = 6  # NIfTI-1 "comment" extension: a JSON label table {value: name}


def mask_label_names(path: str | Path) -> dict[int, str]:
    """The label names ``write_nifti`` stored in a mask file's header ({} when none)."""
    import nibabel as nib

    for ext in nib.load(str(path)).header.extensions:
        if ext.get_code() == _LABELS_ECODE:
            try:
                table = json.loads(ext.get_content()).get("bcer_labels", {})
            except (ValueError, AttributeError):
                continue
            return {int(k): str(v) for k, v in table.items()}
    return {}


def _check_finite(data: np.ndarray, path: Path) -> None:
    if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
        bad = int(np.size(data) - np.count_nonzero(np.isfinite(data)))
        raise ToolError(ErrorCode.numeric, f"{bad} NaN/Inf voxels in {path.name}", file=str(path))


def _bval_sidecar(path: Path) -> dict[str, Any]:
    """The b-value(s) of a diffusion NIfTI from the FSL/BIDS ``.bval`` file beside it (one line of
    numbers, one per volume): ``b_value`` when there is one, ``b_values`` when there are more."""
    name = path.name
    stem = name[:-7] if name.endswith(".nii.gz") else name[:-4] if name.endswith(".nii") else None
    side = None if stem is None else path.with_name(stem + ".bval")
    if side is None or not side.is_file():
        return {}
    try:
        values = [float(v) for v in side.read_text().split()]
    except ValueError as e:
        raise ToolError(ErrorCode.schema, f"{side.name} is not a list of b-values: {e}", file=str(side)) from e
    if not values:
        return {}
    return {"b_value": values[0]} if len(values) == 1 else {"b_values": values}


def read_nifti(path: str | Path, kind: str = "image", labels: dict[int, str] | None = None,
               expect_ndim: int | None = None):
    """Read a NIfTI file as an Image (3-D), Cine (4-D) or Mask.

    Raises:
        ToolError: ``input_missing`` (no file), ``schema`` (corrupt/truncated),
            ``numeric`` (NaN/Inf), ``shape`` (wrong number of dimensions).
    """
    import nibabel as nib

    path = Path(path)
    if not path.exists():
        raise ToolError(ErrorCode.input_missing, f"file not found: {path}", file=str(path))
    try:
        img = nib.load(str(path))
        data = np.asarray(img.dataobj)
        affine = np.asarray(img.affine, dtype=np.float64)
    except (EOFError, OSError, zlib.error, gzip.BadGzipFile, ValueError, nib.filebasedimages.ImageFileError) as e:
        raise ToolError(ErrorCode.schema, f"cannot read NIfTI {path.name}: {type(e).__name__}: {e}",
                        hint="the file is truncated or not NIfTI", file=str(path)) from e
    while data.ndim > 3 and data.shape[-1] == 1 and (expect_ndim or 3) < data.ndim:
        data = data[..., 0]
    if expect_ndim is not None and data.ndim != expect_ndim:
        raise ToolError(ErrorCode.shape, f"{path.name} has {data.ndim} dimensions {data.shape}, "
                        f"expected {expect_ndim}", file=str(path))
    if data.ndim not in (3, 4):
        raise ToolError(ErrorCode.shape, f"{path.name} has shape {data.shape}; expected 3-D or 3-D+time",
                        file=str(path))
    _check_finite(data, path)
    meta: dict[str, Any] = {"source": str(path), **_bval_sidecar(path)}
    if kind == "mask":
        return Mask(data.astype(np.int16), affine, meta, labels=dict(labels or {}))
    data = data.astype(np.float32, copy=False)
    return Cine(data, affine, meta) if data.ndim == 4 else Image(data, affine, meta)


def read_header(path: str | Path) -> dict[str, Any]:
    """Shape, spacing, orientation, affine and dtype of a NIfTI file from its header only.

    Raises:
        ToolError: ``input_missing`` (no file) or ``schema`` (unreadable header).
    """
    import nibabel as nib
    from nibabel.filebasedimages import ImageFileError

    path = Path(path)
    if not path.exists():
        raise ToolError(ErrorCode.input_missing, f"file not found: {path}", file=str(path))
    try:
        img = nib.load(str(path))
        affine = np.asarray(img.affine, dtype=np.float64)
        shape = tuple(int(n) for n in img.shape)
    except (EOFError, OSError, zlib.error, gzip.BadGzipFile, ValueError, ImageFileError) as e:
        raise ToolError(ErrorCode.schema, f"cannot read NIfTI header of {path.name}: "
                        f"{type(e).__name__}: {e}", hint="the file is truncated or not NIfTI",
                        file=str(path)) from e
    return {"shape": shape, "spacing": spacing(affine), "orientation": orientation(affine),
            "affine": affine, "dtype": str(img.get_data_dtype())}


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it; set back at once (module import is single-threaded)
    os.umask(mask)
    return mask


# a deliverable gets the permissions of any file its user writes (mkstemp's 0600 would hide it
# from the rest of a study group on shared storage)
_FILE_MODE = 0o666 & ~_umask()
_TMP_SEQ = itertools.count()


def atomic_write_bytes(path: str | Path, payload: bytes, *more: bytes) -> Path:
    """Write ``payload`` (then ``more``, without joining them in memory) to a temp file in the
    same folder, then rename: readers never see half a file. The file's mode follows the umask,
    as for any file the user writes."""
    path = Path(path)
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
    # a name unique to this process, thread and call (O_EXCL: never someone else's file);
    # cheaper than mkstemp's random names, which cost a tiny case's worker measurably
    while True:
        tmp = os.path.join(folder, f".{path.name}.{os.getpid()}.{threading.get_ident()}.{next(_TMP_SEQ)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
            break
        except FileExistsError:  # left by a killed process that had this pid: take the next name
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            for chunk in more:
                f.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_nifti(artifact, path: str | Path) -> Path:
    """Write an Image/Cine/Mask atomically with its affine (sform and qform)."""
    import nibabel as nib

    path = Path(path)
    data = np.asarray(artifact.data)
    if isinstance(artifact, Mask):
        data = data.astype(np.int16)
    elif not np.issubdtype(data.dtype, np.floating):
        data = data.astype(np.float32)
    img = nib.Nifti1Image(data, np.asarray(artifact.affine, dtype=np.float64))
    img.set_sform(artifact.affine, code=1)
    img.set_qform(artifact.affine, code=1)
    sp = artifact.spacing
    img.header.set_zooms(tuple(sp) + tuple(1.0 for _ in range(data.ndim - 3)))
    img.header.set_xyzt_units("mm", "sec")
    if isinstance(artifact, Mask) and artifact.labels:  # names travel with the file (BIDS dseg.tsv, DICOM SEG)
        img.header.extensions.append(nib.nifti1.Nifti1Extension(
            _LABELS_ECODE, json.dumps({"bcer_labels": {str(k): v for k, v in artifact.labels.items()}}).encode()))
    if not str(path).endswith((".nii", ".nii.gz")):
        path = path.with_name(path.name + ".nii.gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp_", suffix="".join(path.suffixes))
    os.close(fd)
    try:
        nib.save(img, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_sequence(ref) -> object:
    """SequenceRef reader for ``nifti`` (one file) and ``nifti_frames`` (``options.frames``:
    a list of 3-D files stacked along time)."""
    kind = ref.kind.value if hasattr(ref.kind, "value") else str(ref.kind)
    labels = {int(k): v for k, v in ref.options.get("labels", {}).items()}
    if ref.format == "nifti_frames":
        frames = [read_nifti(p, "image", expect_ndim=3) for p in ref.options["frames"]]
        data = np.stack([f.data for f in frames], axis=-1)
        return Cine(data, frames[0].affine, {"source": ref.path})
    if ref.options.get("channel") is not None:  # one channel of a 4-D multi-channel file (MSD)
        vol = read_nifti(ref.path, "image", expect_ndim=4)
        ch = int(ref.options["channel"])
        if not 0 <= ch < vol.data.shape[3]:
            raise ToolError(ErrorCode.shape, f"{Path(ref.path).name} has {vol.data.shape[3]} channels, no channel {ch}",
                            file=ref.path)
        return Image(np.ascontiguousarray(vol.data[..., ch]), vol.affine, {"source": ref.path, "channel": ch})
    expect = {"image": 3, "mask": None, "cine": 4}.get(kind)
    return read_nifti(ref.path, "mask" if kind == "mask" else "image", labels, expect_ndim=expect)
