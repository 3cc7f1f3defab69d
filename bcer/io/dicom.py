"""DICOM MR series: list, read (with exact geometry) and write, via pydicom.

Geometry conventions (why each step is needed):
- DICOM positions are in LPS mm; bcer works in RAS mm, so x and y change sign.
- ``PixelSpacing`` is ``[row spacing, column spacing]``: the distance between *rows*
  (along the column direction cosine ``IOP[3:6]``) comes first. A pixel at row ``r``,
  column ``c`` sits at ``IPP + c * PixelSpacing[1] * IOP[0:3] + r * PixelSpacing[0] * IOP[3:6]``.
- bcer arrays are (X, Y, Z): array axis 0 is the DICOM column index, axis 1 the row index,
  axis 2 the slice. Slices are sorted by their position along the slice normal
  ``IOP[0:3] x IOP[3:6]``; the slice step (and so the third affine column) comes from the
  positions themselves, never from ``SliceThickness`` (which may differ from the spacing,
  e.g. with gaps or overlap). ``SliceThickness`` is used only for a single-slice series.
- When the InstanceNumbers of a series run exactly against the normal (a left-handed stack,
  common after conversion from NIfTI files with flipped axes), the slices are kept in
  InstanceNumber order: the affine then has a negative slice step and still maps every
  voxel to the same world point, and a written series reads back with the affine it had.
- Stored values become ``raw * RescaleSlope + RescaleIntercept`` (per file or per frame), as float32.
- Enhanced (multi-frame) objects are read frame by frame from their functional groups, and
  compressed transfer syntaxes are decoded by pydicom's pylibjpeg plugins
  (``bcer.io.dicom_frames`` holds the frame geometry and the stack checks).
"""
from __future__ import annotations

import io
import logging
import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.artifacts import Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from .dicom_frames import Frame, check_stack, frames_of

log = logging.getLogger(__name__)

MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"
MEDIA_STORAGE_DIRECTORY = "1.2.840.10008.1.3.10"
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def _is_candidate(path: Path) -> bool:
    return path.is_file() and not path.name.startswith(".") and path.suffix.lower() not in (
        ".json", ".nii", ".gz", ".txt", ".tsv", ".csv", ".h5", ".mat", ".png", ".md")


def _read_header(path: Path, pixels: bool = False):
    """One DICOM dataset; None for files that are not DICOM at all (no 'DICM' marker)."""
    import pydicom
    from pydicom.errors import InvalidDicomError

    try:
        return pydicom.dcmread(str(path), stop_before_pixels=not pixels)
    except InvalidDicomError:
        return None
    except Exception as e:  # pydicom raises many types on damaged files
        raise ToolError(ErrorCode.schema, f"cannot parse DICOM file {path.name}: {type(e).__name__}: {e}",
                        hint="the file is truncated or corrupt", file=str(path)) from e


def _is_dicomdir(ds) -> bool:
    meta = getattr(ds, "file_meta", None)
    return str(getattr(meta, "MediaStorageSOPClassUID", "")) == MEDIA_STORAGE_DIRECTORY


def _dicom_files(folder: Path) -> list[Path]:
    if not folder.exists():
        raise ToolError(ErrorCode.input_missing, f"DICOM folder not found: {folder}", file=str(folder))
    if folder.is_file():
        return [folder]
    return sorted(p for p in folder.rglob("*") if _is_candidate(p))


def list_series(folder: str | Path) -> list[dict[str, Any]]:
    """The DICOM series found under ``folder`` (recursively), headers only.

    Returns:
        One dict per series, sorted by SeriesNumber then description: ``SeriesInstanceUID``,
        ``SeriesDescription``, ``ProtocolName``, ``SeriesNumber``, ``Modality``, ``n_files``,
        ``files`` (paths as strings) and ``folder`` (the deepest folder holding all its files).

    Raises:
        ToolError: ``input_missing`` if the folder does not exist, ``schema`` for a damaged file.

    >>> list_series("case01")  # doctest: +SKIP
    [{'SeriesInstanceUID': '1.2...', 'SeriesDescription': 'AX_T2', ..., 'n_files': 20}]
    """
    groups: dict[str, list[tuple[Path, Any]]] = defaultdict(list)
    for path in _dicom_files(Path(folder)):
        ds = _read_header(path)
        if ds is None or _is_dicomdir(ds):
            log.debug("skipping non-DICOM file or DICOMDIR %s", path)
            continue
        if "SeriesInstanceUID" not in ds:  # type 1 in every composite object: cut short
            raise ToolError(ErrorCode.schema, f"DICOM file {path.name} has no SeriesInstanceUID",
                            hint="the file is truncated or corrupt", file=str(path))
        groups[str(ds.SeriesInstanceUID)].append((path, ds))
    out = []
    for uid, items in groups.items():
        first = items[0][1]
        files = [str(p) for p, _ in items]
        common = Path(*Path(files[0]).parent.parts)
        for f in files[1:]:
            while common not in Path(f).parents:
                common = common.parent
        out.append({"SeriesInstanceUID": uid,
                    "SeriesDescription": str(first.get("SeriesDescription", "") or ""),
                    "ProtocolName": str(first.get("ProtocolName", "") or ""),
                    "SeriesNumber": int(first.get("SeriesNumber", 0) or 0),
                    "Modality": str(first.get("Modality", "") or ""),
                    "n_files": len(files), "files": files, "folder": str(common)})
    return sorted(out, key=lambda s: (s["SeriesNumber"], s["SeriesDescription"], s["SeriesInstanceUID"]))


def _require_pixels(ds, path: Path) -> None:
    if "PixelData" not in ds:
        raise ToolError(ErrorCode.schema, f"DICOM file {path.name} lacks ['PixelData']",
                        hint="the file is truncated, or not an image", file=str(path))
    if int(ds.get("SamplesPerPixel", 1) or 1) != 1:
        raise ToolError(ErrorCode.shape, f"{path.name} has {ds.SamplesPerPixel} samples per pixel; expected one "
                        "grey-level channel", file=str(path))


def _decoded(ds, path: Path) -> np.ndarray:
    """Stored values as (frames, rows, cols); compressed syntaxes go through pydicom's
    decoders (pylibjpeg's openjpeg/libjpeg/rle plugins for JPEG 2000, JPEG-LS, JPEG, RLE)."""
    try:
        raw = ds.pixel_array
    except Exception as e:  # truncated pixel data, missing decoder, ...
        syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
        name = getattr(syntax, "name", str(syntax))
        raise ToolError(ErrorCode.schema, f"cannot decode pixel data of {path.name} ({name}): "
                        f"{type(e).__name__}: {e}",
                        hint="the file is truncated, or its compression needs a decoder that is not installed "
                        "(pylibjpeg, pylibjpeg-openjpeg, pylibjpeg-libjpeg, pylibjpeg-rle)", file=str(path)) from e
    n = int(ds.get("NumberOfFrames", 1) or 1)
    raw = raw[None] if raw.ndim == 2 else raw
    if raw.ndim != 3 or raw.shape[0] != n:
        raise ToolError(ErrorCode.shape, f"{path.name} pixel data has shape {raw.shape}; expected {n} grey-level "
                        "frame(s)", file=str(path))
    return raw


def _frames(files: list[str], pixels: bool) -> tuple[list[Frame], dict[Path, Any]]:
    frames, datasets = [], {}
    for f in files:
        path = Path(f)
        ds = _read_header(path, pixels=pixels)
        if pixels:
            _require_pixels(ds, path)
        datasets[path] = ds
        frames += frames_of(ds, path)
    return frames, datasets


def _where(series: dict[str, Any]) -> str:
    return f"series {series['SeriesDescription']!r} (#{series['SeriesNumber']}, {series['n_files']} files)"


def check_series(series: dict[str, Any]) -> int:
    """Check from headers alone that a ``list_series`` entry is one volume; returns its slice count.

    Raises:
        ToolError: ``schema`` for missing geometry, mixed orientations, duplicated or missing
            slices (naming the files and what was expected).
    """
    frames, _ = _frames(series["files"], pixels=False)
    return len(check_stack(frames, _where(series))[0])


def read_series(folder: str | Path, series_uid: str | None = None) -> Image:
    """Read one DICOM series as an Image with its RAS affine.

    Args:
        folder: a folder holding the series (searched recursively), or a single file (a
            one-slice image or an enhanced multi-frame object).
        series_uid: which SeriesInstanceUID to read when the folder holds several.

    Returns:
        Image with float32 data (X=columns, Y=rows, Z=slices) and meta ``SeriesDescription``,
        ``ProtocolName``, ``SeriesInstanceUID``, ``source``.

    Raises:
        ToolError: ``input_missing`` (no folder / no DICOM files), ``schema`` (truncated or
            damaged file, several series and no ``series_uid``, inconsistent geometry,
            duplicated or missing slices, no decoder), ``shape`` (slices of different matrix size).
    """
    folder = Path(folder)
    series = list_series(folder)
    if not series:
        raise ToolError(ErrorCode.input_missing, f"no DICOM files in {folder}", file=str(folder))
    if series_uid is not None:
        series = [s for s in series if s["SeriesInstanceUID"] == series_uid]
        if not series:
            raise ToolError(ErrorCode.input_missing, f"series {series_uid} not found in {folder}", file=str(folder))
    if len(series) > 1:
        names = [f"{s['SeriesDescription']} ({s['SeriesInstanceUID']})" for s in series]
        raise ToolError(ErrorCode.schema, f"{folder} holds {len(series)} series: {names}",
                        hint="pass series_uid to choose one", file=str(folder))
    frames, datasets = _frames(series[0]["files"], pixels=True)
    return _assemble(frames, datasets, folder, _where(series[0]))


def _stacked(ordered: list[Frame], datasets: dict[Path, Any]) -> np.ndarray:
    decoded: dict[Path, np.ndarray] = {}
    slices = []
    for f in ordered:
        if f.path not in decoded:
            decoded[f.path] = _decoded(datasets[f.path], f.path)
        px = decoded[f.path][f.index or 0].astype(np.float64) * f.slope + f.intercept
        if slices and px.shape != slices[0].shape:
            raise ToolError(ErrorCode.shape, f"{f.name} has matrix {px.shape}, the series has {slices[0].shape}",
                            file=str(f.path))
        slices.append(px.astype(np.float32))
    return np.ascontiguousarray(np.stack(slices, axis=-1).transpose(1, 0, 2))  # (rows, cols, z) -> (X, Y, Z)


def _assemble(frames: list[Frame], datasets: dict[Path, Any], folder: Path, where: str) -> Image:
    ordered, step = check_stack(frames, where)
    data = _stacked(ordered, datasets)
    row_sp, col_sp = ordered[0].pixel_spacing
    lps = np.eye(4)
    lps[:3, 0] = ordered[0].iop[:3] * col_sp
    lps[:3, 1] = ordered[0].iop[3:] * row_sp
    lps[:3, 2] = step
    lps[:3, 3] = ordered[0].ipp
    first = datasets[ordered[0].path]
    meta = {"source": str(folder), "format": "dicom",
            "SeriesInstanceUID": str(first.get("SeriesInstanceUID", "")),
            "SeriesDescription": str(first.get("SeriesDescription", "") or ""),
            "ProtocolName": str(first.get("ProtocolName", "") or ""),
            "Modality": str(first.get("Modality", "") or ""), "n_files": len(datasets), "n_slices": len(ordered),
            "transfer_syntax": str(getattr(getattr(first, "file_meta", None), "TransferSyntaxUID", "") or "")}
    if first.get("DiffusionBValue") is not None:  # (0018,9087): a DWI series' b-value, s/mm^2
        meta["b_value"] = float(first.DiffusionBValue)
    if not np.all(np.isfinite(data)):
        raise ToolError(ErrorCode.numeric, f"series in {folder} has NaN/Inf values", file=str(folder))
    return Image(data, LPS_TO_RAS @ lps, meta)


def read_sequence(ref) -> Image:
    """SequenceRef reader for format ``dicom``: ``ref.path`` is a folder (or file) of one
    series; ``ref.options['series_uid']`` selects a series when the folder holds several."""
    return read_series(ref.path, ref.options.get("series_uid"))


def _age(value: Any) -> float | None:
    m = re.fullmatch(r"(\d{1,3})([DWMY]?)", str(value or "").strip())
    if not m:
        return None
    per_year = {"D": 365.25, "W": 52.18, "M": 12.0, "Y": 1.0, "": 1.0}[m.group(2)]
    return round(int(m.group(1)) / per_year, 2)


def patient_metadata(first_file: str) -> dict[str, Any]:
    """Age (years), sex, weight (kg) and height (cm) from one header (real data carries no truth
    sidecar); tags that are absent or unparseable are left out."""
    import pydicom

    ds = pydicom.dcmread(first_file, stop_before_pixels=True,
                         specific_tags=["PatientAge", "PatientSex", "PatientWeight", "PatientSize"])
    meta: dict[str, Any] = {}
    if _age(ds.get("PatientAge")) is not None:
        meta["age"] = _age(ds.get("PatientAge"))
    if ds.get("PatientSex"):
        meta["sex"] = str(ds.PatientSex)
    try:
        if ds.get("PatientWeight"):
            meta["weight"] = float(ds.PatientWeight)
        if ds.get("PatientSize"):
            meta["height"] = round(float(ds.PatientSize) * 100.0, 1)
    except (TypeError, ValueError):
        log.debug("unparseable patient size/weight in %s", first_file)
    return meta



# ----------------------------------------------------------------------------- writing

def _ds_str(x: float) -> str:
    """A DICOM decimal string (<= 16 characters) with as many digits as fit."""
    from pydicom.valuerep import format_number_as_ds

    return format_number_as_ds(float(x))


def _quantise(data: np.ndarray) -> tuple[np.ndarray, float, float, int]:
    """Stored integers plus (slope, intercept, pixel representation).

    Integer-valued data that fits int16/uint16 is stored exactly; anything else is scaled
    to the full uint16 range (error <= slope / 2)."""
    lo, hi = float(np.min(data)), float(np.max(data))
    if np.all(np.mod(data, 1) == 0):
        if lo >= 0 and hi <= 65535:
            return data.astype(np.uint16), 1.0, 0.0, 0
        if lo >= -32768 and hi <= 32767:
            return data.astype(np.int16), 1.0, 0.0, 1
    slope = (hi - lo) / 65535.0 if hi > lo else 1.0
    slope = float(_ds_str(slope))  # what the file will say, so the quantisation matches it exactly
    intercept = float(_ds_str(lo))
    stored = np.clip(np.rint((data.astype(np.float64) - intercept) / slope), 0, 65535)
    return stored.astype(np.uint16), slope, intercept, 0


def _series_datasets(image: Image, description: str, series_number: int, protocol_name: str | None,
                     patient_id: str, study_uid: str | None, series_uid: str | None,
                     extra: dict[str, Any] | None):
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, PYDICOM_IMPLEMENTATION_UID, generate_uid

    data = np.asarray(image.data)
    stored, slope, intercept, pixrep = _quantise(data)
    lps = LPS_TO_RAS @ np.asarray(image.affine, dtype=np.float64)
    sp = np.linalg.norm(lps[:3, :3], axis=0)
    row_dir, col_dir = lps[:3, 0] / sp[0], lps[:3, 1] / sp[1]
    study_uid, series_uid, frame_uid = study_uid or generate_uid(), series_uid or generate_uid(), generate_uid()
    now = datetime.now(timezone.utc)
    normal = np.cross(row_dir, col_dir)
    for k in range(data.shape[2]):
        ipp = lps[:3, :3] @ [0.0, 0.0, float(k)] + lps[:3, 3]
        sop_uid = generate_uid()
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = MR_IMAGE_STORAGE
        meta.MediaStorageSOPInstanceUID = sop_uid
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = MR_IMAGE_STORAGE, sop_uid
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study_uid, series_uid, frame_uid
        ds.Modality, ds.ImageType = "MR", ["DERIVED", "SECONDARY"]
        ds.PatientName, ds.PatientID = patient_id, patient_id
        ds.StudyDate = ds.SeriesDate = ds.ContentDate = now.strftime("%Y%m%d")
        ds.StudyTime = ds.SeriesTime = ds.ContentTime = now.strftime("%H%M%S")
        ds.StudyID, ds.AccessionNumber, ds.ReferringPhysicianName = "1", "", ""
        ds.PatientBirthDate, ds.PatientSex = "", ""
        ds.SeriesDescription, ds.ProtocolName = description, protocol_name or description
        ds.SeriesNumber, ds.InstanceNumber = int(series_number), k + 1
        ds.ScanningSequence, ds.SequenceVariant, ds.ScanOptions = "SE", "NONE", ""
        ds.MRAcquisitionType, ds.EchoTime, ds.RepetitionTime, ds.EchoTrainLength = "2D", "", "", ""
        ds.ImageOrientationPatient = [_ds_str(v) for v in (*row_dir, *col_dir)]
        ds.ImagePositionPatient = [_ds_str(v) for v in ipp]
        ds.SliceLocation = _ds_str(float(np.dot(normal, ipp)))
        ds.PixelSpacing = [_ds_str(sp[1]), _ds_str(sp[0])]  # [row spacing, column spacing]
        ds.SliceThickness = ds.SpacingBetweenSlices = _ds_str(sp[2])
        ds.PositionReferenceIndicator = ""
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.Rows, ds.Columns = int(data.shape[1]), int(data.shape[0])
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, pixrep
        ds.RescaleSlope, ds.RescaleIntercept, ds.RescaleType = _ds_str(slope), _ds_str(intercept), "US"
        for key, value in (extra or {}).items():
            setattr(ds, key, value)
        ds.PixelData = np.ascontiguousarray(stored[:, :, k].T).tobytes()  # (X, Y) -> (rows, cols)
        yield k, ds


def write_series(image: Image | Mask, folder: str | Path, description: str, series_number: int = 1,
                 protocol_name: str | None = None, patient_id: str = "ANON",
                 study_uid: str | None = None, series_uid: str | None = None,
                 extra: dict[str, Any] | None = None) -> list[Path]:
    """Write a 3-D Image as an MR Image Storage series, one file per slice ``IM_0001.dcm``...

    Args:
        image: the volume; any orientation (the affine's third column becomes the slice step).
        folder: output folder (created); files are written atomically.
        description: SeriesDescription (and ProtocolName unless ``protocol_name`` is given).
        series_number, patient_id, study_uid, series_uid: identifiers (UIDs generated if None;
            pass one ``study_uid`` for all series of a case).
        extra: more DICOM keywords to set on every file (e.g. ``{"DiffusionBValue": 1400}``).

    Returns:
        The written paths in slice order. Reading them back with ``read_series`` gives the
        same affine (to DICOM's 16-character decimal precision) and the same array (exact for
        integer data, within ``(max - min) / 65535 / 2`` otherwise).

    Raises:
        ToolError: ``shape`` for anything but a 3-D volume, ``numeric`` for NaN/Inf.
    """
    from .nifti import atomic_write_bytes

    data = np.asarray(image.data) if isinstance(image, (Image, Mask)) else None
    if data is None or data.ndim != 3:
        raise ToolError(ErrorCode.shape, f"write_series needs a 3-D volume, got "
                        f"{None if data is None else data.shape}", arg="image", file=str(folder))
    if not np.all(np.isfinite(data)):
        raise ToolError(ErrorCode.numeric, "cannot write NaN/Inf voxels to DICOM", arg="image", file=str(folder))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, ds in _series_datasets(image, description, series_number, protocol_name, patient_id,
                                  study_uid, series_uid, extra):
        buf = io.BytesIO()
        ds.save_as(buf, enforce_file_format=True)
        paths.append(atomic_write_bytes(folder / f"IM_{k + 1:04d}.dcm", buf.getvalue()))
    return paths


def sanitise_description(text: str) -> str:
    """A SeriesDescription made safe as a folder or sequence name (``AX T2 (fs)`` -> ``AX_T2_fs``)."""
    s = re.sub(r"[^A-Za-z0-9]+", "_", str(text)).strip("_")
    return s or "UNNAMED"
