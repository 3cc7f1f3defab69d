"""DICOM SEG out: a label mask written as a DICOM Segmentation over the series it was made from.

The mask (any grid, with its affine) is sampled onto the source series' own frames by world
coordinates, nearest neighbour, so the SEG frames line up with the source pixels whatever
the orientation or slice order the reader chose. Single-frame series (one file per slice) and
enhanced multi-frame images (one file, per-frame functional groups) are both accepted. The SEG
references the source series, study and frame of reference (highdicom copies them from the
source datasets).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.errors import ErrorCode, ToolError

log = logging.getLogger(__name__)
_LPS_FROM_RAS = np.diag([-1.0, -1.0, 1.0])

__all__ = ["frame_geometry", "mask_on_frames", "mask_on_series", "read_source_series", "write_seg"]


def read_source_series(folder: str | Path, series_uid: str | None = None) -> list[Any]:
    """The datasets (pixels included: highdicom needs them whole) of one series in ``folder``,
    sorted along the slice normal; several series in the folder need ``series_uid``.

    Raises:
        ToolError: ``input_missing`` when no file of that series is there.
    """
    import pydicom

    folder = Path(folder)
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    found = []
    for p in files:
        try:
            ds = pydicom.dcmread(p)
        except (pydicom.errors.InvalidDicomError, OSError, ValueError):
            continue  # not DICOM (a DICOMDIR's neighbours, sidecars): the series is read from the rest
        if "SeriesInstanceUID" in ds and (series_uid is None or str(ds.SeriesInstanceUID) == series_uid):
            found.append(ds)
    uids = {str(ds.SeriesInstanceUID) for ds in found}
    if not found or len(uids) > 1:
        raise ToolError(ErrorCode.input_missing, f"{folder}: {len(uids)} series match "
                        f"{series_uid or 'any series'} (found {sorted(uids)[:5]})",
                        hint="name the SeriesInstanceUID of the source series", file=str(folder))
    if len(found) == 1:
        return found
    normal = np.cross(*np.reshape(np.asarray(found[0].ImageOrientationPatient, float), (2, 3)))
    return sorted(found, key=lambda ds: float(np.dot(normal, np.asarray(ds.ImagePositionPatient, float))))


def _attr(groups: Any, seq: str, name: str) -> Any:
    return getattr(getattr(groups, seq)[0], name) if groups is not None and seq in groups else None


def frame_geometry(datasets: Sequence[Any]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int, int]]:
    """Per frame, in SEG order: position (LPS, mm), row and column direction cosines,
    (row, column) spacing in mm, and the frame's (rows, columns)."""
    out = []
    for ds in datasets:
        n = int(getattr(ds, "NumberOfFrames", 1) or 1)
        shared = ds.SharedFunctionalGroupsSequence[0] if "SharedFunctionalGroupsSequence" in ds else None
        for i in range(n):
            per = ds.PerFrameFunctionalGroupsSequence[i] if "PerFrameFunctionalGroupsSequence" in ds else None
            pos = _attr(per, "PlanePositionSequence", "ImagePositionPatient") or ds.get("ImagePositionPatient")
            iop = (_attr(per, "PlaneOrientationSequence", "ImageOrientationPatient")
                   or _attr(shared, "PlaneOrientationSequence", "ImageOrientationPatient")
                   or ds.get("ImageOrientationPatient"))
            spacing = (_attr(per, "PixelMeasuresSequence", "PixelSpacing")
                       or _attr(shared, "PixelMeasuresSequence", "PixelSpacing") or ds.get("PixelSpacing"))
            if pos is None or iop is None or spacing is None:
                raise ToolError(ErrorCode.schema, f"frame {i + 1} of {ds.get('SOPInstanceUID')} has no plane "
                                "position, orientation or pixel spacing", hint="a SEG needs a source with geometry")
            iop = np.asarray(iop, float)
            out.append((np.asarray(pos, float), iop[:3], iop[3:], np.asarray(spacing, float),
                        int(ds.Rows), int(ds.Columns)))
    return out


def mask_on_frames(data: np.ndarray, affine: np.ndarray, geometry: list) -> np.ndarray:
    """Sample a label volume (RAS affine) at every pixel centre of the given frames:
    ``(frames, rows, columns)``, 0 outside the mask's grid."""
    inv = np.linalg.inv(np.asarray(affine, float))
    frames = []
    for pos, row_dir, col_dir, (dr, dc), rows, cols in geometry:
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        # DICOM: column index walks the row direction (spacing dc), row index the column direction
        lps = pos + c[..., None] * dc * row_dir + r[..., None] * dr * col_dir
        ras = lps @ _LPS_FROM_RAS.T
        ijk = np.rint(ras @ inv[:3, :3].T + inv[:3, 3]).astype(int)
        inside = np.all((ijk >= 0) & (ijk < np.asarray(data.shape[:3])), axis=-1)
        frame = np.zeros((rows, cols), data.dtype)
        frame[inside] = data[tuple(ijk[inside].T)]
        frames.append(frame)
    return np.stack(frames)


def mask_on_series(data: np.ndarray, affine: np.ndarray, datasets: Sequence[Any]) -> np.ndarray:
    """``mask_on_frames`` over the frames of source datasets."""
    return mask_on_frames(data, affine, frame_geometry(datasets))


def _description(number: int, label: str, version: str) -> Any:
    import highdicom as hd
    from pydicom.sr.codedict import codes

    algorithm = hd.AlgorithmIdentificationSequence(name="bcer", version=version,
                                                   family=codes.cid7162.ArtificialIntelligence)
    lesion = any(w in label.lower() for w in ("lesion", "tumour", "tumor", "enhancing", "necrotic", "oedema",
                                              "edema", "wt", "tc", "et"))
    return hd.seg.SegmentDescription(
        segment_number=number, segment_label=label[:64],
        segmented_property_category=codes.SCT.MorphologicallyAbnormalStructure if lesion else codes.SCT.Tissue,
        segmented_property_type=codes.SCT.Lesion if lesion else codes.SCT.Tissue,
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC, algorithm_identification=algorithm,
        tracking_id=label[:64], tracking_uid=hd.UID())


def write_seg(data: np.ndarray, affine: np.ndarray, labels: dict[int, str], sources: Sequence[Any],
              path: str | Path, *, series_number: int = 900, version: str = "0") -> tuple[Any, dict[int, int]]:
    """Write ``data`` (label values, RAS ``affine``) as a binary DICOM SEG over ``sources``.

    Label values present in the mask become segments 1..N in ascending value order.

    Returns:
        The SEG dataset and ``{label value: segment number}``.

    Raises:
        ToolError: ``value_range`` when the mask has no label on the source frames.
    """
    import highdicom as hd

    frames = mask_on_series(np.asarray(data), affine, sources)
    values = [int(v) for v in np.unique(frames) if v != 0]
    if not values:
        raise ToolError(ErrorCode.value_range, f"mask for {path} is empty on the source series' frames",
                        hint="the mask does not overlap the source series", file=str(path))
    segments = {v: i + 1 for i, v in enumerate(values)}
    stack = np.stack([frames == v for v in values], axis=-1).astype(np.uint8)
    seg = hd.seg.Segmentation(
        source_images=list(sources), pixel_array=stack,
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=[_description(segments[v], labels.get(v, f"label_{v}"), version) for v in values],
        series_instance_uid=hd.UID(), series_number=series_number, sop_instance_uid=hd.UID(), instance_number=1,
        manufacturer="bcer", manufacturer_model_name="bcer", software_versions=version, device_serial_number="0",
        series_description="bcer segmentation", omit_empty_frames=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    seg.save_as(path)
    return seg, segments
