"""The slices of a DICOM series as frames: one per classic single-frame file, or one per frame
of an enhanced (multi-frame) object, each with its own geometry; and the checks that make a
stack of them one volume.

Enhanced MR (and other enhanced images) keep geometry in functional groups: a frame's
``PlanePositionSequence`` (ImagePositionPatient), ``PlaneOrientationSequence``,
``PixelMeasuresSequence`` (PixelSpacing, SliceThickness, SpacingBetweenSlices) and
``PixelValueTransformationSequence`` (rescale) sit in its ``PerFrameFunctionalGroupsSequence``
item or, when shared by every frame, in ``SharedFunctionalGroupsSequence``.

Checks (all from headers, so a dataset reader can run them before any pixel is decoded):
slices of one orientation; no two at one position (a duplicated file, or echoes/time points
mixed in); equal steps along the normal, so a missing slice is named by the two slices around
the gap and the number of slices expected, never read as a shorter volume.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.errors import ErrorCode, ToolError

_SPACING_RTOL = 0.01  # slice steps may differ by 1 % (rounding in IPP strings), no more
__all__ = ["Frame", "frames_of", "order_frames", "slice_step", "check_stack"]


@dataclass
class Frame:
    """One 2-D slice: where it comes from and where it sits (LPS mm)."""

    path: Path
    index: int | None  # frame number (0-based) inside a multi-frame file; None for one-slice files
    ipp: np.ndarray
    iop: np.ndarray
    pixel_spacing: tuple[float, float]  # [row spacing, column spacing]
    thickness: float
    # InstanceNumber of a one-slice file (its acquisition order); 0 for the frames of an
    # enhanced object, which are always stacked along the slice normal
    order: int
    slope: float = 1.0
    intercept: float = 0.0
    sop_uid: str = ""

    @property
    def name(self) -> str:
        return self.path.name if self.index is None else f"{self.path.name} frame {self.index + 1}"

    @property
    def normal(self) -> np.ndarray:
        return np.cross(self.iop[:3], self.iop[3:])


def _floats(values: Any) -> np.ndarray:
    return np.asarray([float(v) for v in values], dtype=np.float64)


def _group(item, shared, keyword: str):
    """The first item of functional group ``keyword``, per-frame before shared."""
    for src in (item, shared):
        if src is not None and keyword in src and len(src[keyword].value):
            return src[keyword][0]
    return None


def _missing(path: Path, what: list[str], hint: str) -> ToolError:
    return ToolError(ErrorCode.schema, f"DICOM file {path.name} lacks {what}", hint=hint, file=str(path))


def _classic(ds, path: Path) -> list[Frame]:
    missing = [t for t in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing") if t not in ds]
    if missing:
        raise _missing(path, missing, "the file is truncated, or not an image with patient geometry")
    thick = float(ds.get("SpacingBetweenSlices", 0) or 0) or float(ds.get("SliceThickness", 0) or 0)
    return [Frame(path, None, _floats(ds.ImagePositionPatient), _floats(ds.ImageOrientationPatient),
                  tuple(_floats(ds.PixelSpacing)), thick, int(ds.get("InstanceNumber", 0) or 0),
                  float(ds.get("RescaleSlope", 1.0) or 1.0), float(ds.get("RescaleIntercept", 0.0) or 0.0),
                  str(ds.get("SOPInstanceUID", "")))]


def _enhanced(ds, path: Path) -> list[Frame]:
    n = int(ds.get("NumberOfFrames", 1) or 1)
    per = ds.get("PerFrameFunctionalGroupsSequence")
    shared = ds.SharedFunctionalGroupsSequence[0] if ds.get("SharedFunctionalGroupsSequence") else None
    if per is None or len(per) != n:
        raise _missing(path, ["PerFrameFunctionalGroupsSequence"] if per is None else
                       [f"one functional-group item per frame ({len(per)} items, {n} frames)"],
                       f"a multi-frame image of {n} frames needs each frame's position to be a volume")
    out = []
    for k, item in enumerate(per):
        pos, ori = _group(item, shared, "PlanePositionSequence"), _group(item, shared, "PlaneOrientationSequence")
        meas, pvt = _group(item, shared, "PixelMeasuresSequence"), _group(item, shared, "PixelValueTransformationSequence")
        lacking = [name for name, g, tag in (("PlanePositionSequence", pos, "ImagePositionPatient"),
                                             ("PlaneOrientationSequence", ori, "ImageOrientationPatient"),
                                             ("PixelMeasuresSequence", meas, "PixelSpacing"))
                   if g is None or tag not in g]
        if lacking:
            raise _missing(path, [f"{x} (frame {k + 1})" for x in lacking],
                           "the enhanced object carries no plane geometry for its frames")
        thick = float(meas.get("SpacingBetweenSlices", 0) or 0) or float(meas.get("SliceThickness", 0) or 0)
        slope = float((pvt or ds).get("RescaleSlope", 1.0) or 1.0)
        intercept = float((pvt or ds).get("RescaleIntercept", 0.0) or 0.0)
        out.append(Frame(path, k, _floats(pos.ImagePositionPatient), _floats(ori.ImageOrientationPatient),
                         tuple(_floats(meas.PixelSpacing)), thick, 0, slope, intercept,
                         f"{ds.get('SOPInstanceUID', '')}#{k + 1}"))
    return out


def frames_of(ds, path: Path) -> list[Frame]:
    """The frames of one dataset (header only: ``stop_before_pixels`` is enough).

    Raises:
        ToolError: ``schema`` naming the file when geometry is absent.
    """
    if int(ds.get("NumberOfFrames", 1) or 1) > 1 or "PerFrameFunctionalGroupsSequence" in ds:
        return _enhanced(ds, path)
    return _classic(ds, path)


def order_frames(frames: list[Frame]) -> list[Frame]:
    """Frames sorted along the slice normal; a stack whose acquisition order runs exactly
    against the normal keeps that order (a left-handed stack, see ``bcer.io.dicom``)."""
    normal = frames[0].normal
    pos = np.array([np.dot(normal, f.ipp) for f in frames])
    order = list(np.argsort(pos, kind="stable"))
    inst = [frames[i].order for i in order]
    if len(inst) > 1 and all(a > b for a, b in zip(inst, inst[1:])):
        order.reverse()
    return [frames[i] for i in order]


def _duplicate(a: Frame, b: Frame, where: str) -> ToolError:
    same = a.sop_uid and a.sop_uid == b.sop_uid
    why = "the same instance twice (a copied file)" if same else "two acquisitions (echoes, time points or a repeat)"
    return ToolError(ErrorCode.schema, f"{a.name} and {b.name} of {where} share one slice position "
                     f"({np.round(a.ipp, 3).tolist()} mm): {why}; expected one slice per position",
                     hint="remove the copy, or split the acquisitions into their own series", file=str(b.path),
                     other=str(a.path))


def slice_step(frames: list[Frame], where: str) -> np.ndarray:
    """The LPS vector from one slice origin to the next of ordered ``frames``.

    Raises:
        ToolError: ``schema`` for two slices at one position, or unequal steps (a missing
            slice: names the slices on both sides of the gap and the slices expected).
    """
    if len(frames) == 1:
        return frames[0].normal * (frames[0].thickness or 1.0)
    ipp = np.array([f.ipp for f in frames])
    dist = np.linalg.norm(np.diff(ipp, axis=0), axis=1)
    if np.min(dist) < 1e-3:
        k = int(np.argmin(dist))
        raise _duplicate(frames[k], frames[k + 1], where)
    step = float(np.median(dist))
    bad = np.flatnonzero(np.abs(dist - step) > _SPACING_RTOL * step)
    if bad.size:
        k = int(bad[0])
        span = float(np.linalg.norm(ipp[-1] - ipp[0]))
        expected = int(round(span / step)) + 1
        a, b = frames[k], frames[k + 1]
        gap = f"{dist[k]:.3f} mm between {a.name} and {b.name} where the series steps {step:.3f} mm"
        what = (f"{expected - len(frames)} slice(s) missing: expected {expected} slices over {span:.1f} mm, "
                f"found {len(frames)}" if dist[k] > step else "slices closer than the series' step")
        raise ToolError(ErrorCode.schema, f"slice spacing of {where} is not uniform: {gap}; {what}",
                        hint="a slice file is missing or the series mixes stacks; re-export the series",
                        file=str(b.path), other=str(a.path))
    return (ipp[-1] - ipp[0]) / (len(frames) - 1)


def check_stack(frames: list[Frame], where: str) -> tuple[list[Frame], np.ndarray]:
    """Ordered frames and their slice step, after checking they form one volume.

    Raises:
        ToolError: ``schema`` (mixed orientations, duplicated or missing slices), naming files.
    """
    first = frames[0]
    for f in frames[1:]:
        if not np.allclose(f.iop, first.iop, atol=1e-4):
            raise ToolError(ErrorCode.schema, f"{f.name} has another slice orientation than {first.name} in {where}",
                            hint="the series mixes stacks (e.g. a localizer)", file=str(f.path))
        if not np.allclose(f.pixel_spacing, first.pixel_spacing, rtol=1e-4):
            raise ToolError(ErrorCode.schema, f"{f.name} has pixel spacing {list(f.pixel_spacing)}, "
                            f"{first.name} {list(first.pixel_spacing)} in {where}", file=str(f.path))
    ordered = order_frames(frames)
    return ordered, slice_step(ordered, where)
