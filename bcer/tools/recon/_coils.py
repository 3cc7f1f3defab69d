"""Shared plumbing of the recon tools: k-space checks, sampling-pattern analysis (ACS block,
acceleration, lattice), slice batching, output artifacts (coil maps live in ``_maps``).

Slices are processed as a batch ``(N, C, X, Y)`` with ``N = Z`` (volume) or ``N = Z * T``
(cine, frame index fastest), so volume and cine variants share one core.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ...contracts.artifacts import Cine, Image, KSpace
from ...contracts.errors import ErrorCode, ToolError
from .._checks import require_finite
from .._gpu import to_numpy

log = logging.getLogger(__name__)

# Bytes of complex64 k-space moved to the array module per batch: bounds the peak memory of
# the GRAPPA source matrices and CG vectors (a few times this) on small shared machines.
_BATCH_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Sampling:
    """What the sampling mask says. ``lines``: (Y,) bool of fully acquired phase-encoding
    lines; ``mask2d``: (X, Y) bool sampling pattern; ``acs``: [start, stop) of the central
    fully sampled block; ``R``: lattice step outside it (1 when fully sampled); ``offset``:
    first lattice line (``y % R == offset``); ``uniform``: sampled lines outside the ACS all
    lie on that lattice."""

    lines: np.ndarray
    mask2d: np.ndarray
    acs: tuple[int, int]
    R: int
    offset: int
    uniform: bool

    @property
    def n_acs(self) -> int:
        return self.acs[1] - self.acs[0]


def check_kspace(kspace: KSpace, cine: bool, tool: str) -> np.ndarray:
    """The (C, X, Y, Z[, T]) k-space array, checked for dimensions, mask shape and finiteness."""
    data = np.asarray(kspace.data)
    want = 5 if cine else 4
    if data.ndim != want:
        other = f"{tool}_cine" if data.ndim == 5 else tool.removesuffix("_cine")
        layout = "(C, X, Y, Z, T)" if cine else "(C, X, Y, Z)"
        hint = (f"use {other} for {data.ndim}-D k-space" if data.ndim in (4, 5)
                else "k-space needs a leading coil axis")
        raise ToolError(ErrorCode.shape, f"input 'kspace' of {tool} has shape {data.shape}; "
                        f"expected {layout}", hint=hint, arg="kspace")
    if not np.iscomplexobj(data):
        raise ToolError(ErrorCode.schema, f"input 'kspace' of {tool} is {data.dtype}, not complex",
                        hint="k-space must be complex (coil, kx, ky, ...)", arg="kspace")
    mask = np.asarray(kspace.mask)
    x, y = data.shape[1], data.shape[2]
    if mask.shape not in ((y,), (x, y)):
        raise ToolError(ErrorCode.shape, f"sampling mask of {tool} has shape {mask.shape}; "
                        f"expected ({y},) phase-encoding lines or ({x}, {y})",
                        hint="the mask must match the k-space Y axis (data axis 2)", arg="kspace.mask")
    require_finite(kspace, "kspace")
    recon_crop(kspace, tool)  # a recon matrix that does not fit fails before any work
    return data


def analyse_mask(mask: np.ndarray, shape_xy: tuple[int, int]) -> Sampling:
    """ACS block, acceleration and lattice of a Cartesian mask ((Y,) or (X, Y))."""
    x, y = shape_xy
    m = np.asarray(mask).astype(bool)
    mask2d = np.broadcast_to(m, (x, y)).copy() if m.ndim == 1 else m
    lines = mask2d.all(axis=0)
    acs = _central_run(lines)
    outside = np.flatnonzero(lines & ~_span(acs, y))
    if outside.size < 2:
        R, offset = (1, 0) if lines.all() else (max(1, y // max(int(lines.sum()), 1)), 0)
        return Sampling(lines, mask2d, acs, R, offset, uniform=outside.size == 0 and lines.all())
    steps = np.diff(outside)
    R = int(np.bincount(steps).argmax())
    offset = int(outside[0] % R)
    uniform = bool(np.all(outside % R == offset)) and not (mask2d & ~lines[None, :]).any()
    return Sampling(lines, mask2d, acs, R, offset, uniform)


def _central_run(lines: np.ndarray) -> tuple[int, int]:
    """[start, stop) of the run of sampled lines containing the centre (or the longest run)."""
    y = lines.size
    if not lines.any():
        return (y // 2, y // 2)
    edges = np.diff(np.concatenate([[0], lines.astype(np.int8), [0]]))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    hit = [(a, b) for a, b in zip(starts, stops) if a <= y // 2 < b]
    a, b = hit[0] if hit else max(zip(starts, stops), key=lambda r: r[1] - r[0])
    return int(a), int(b)


def _span(run: tuple[int, int], n: int) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[run[0]:run[1]] = True
    return out


def as_slices(data: np.ndarray) -> np.ndarray:
    """(C, X, Y, Z[, T]) -> (N, C, X, Y) view-or-copy, N = Z or Z*T (frame fastest)."""
    c, x, y = data.shape[:3]
    return data.reshape(c, x, y, -1).transpose(3, 0, 1, 2)


def from_slices(images: np.ndarray, data_shape: tuple[int, ...]) -> np.ndarray:
    """(N, X, Y) -> (X, Y, Z[, T]), the inverse of ``as_slices`` for coil-combined images."""
    return np.ascontiguousarray(images.transpose(1, 2, 0)).reshape(data_shape[1:])


def batches(slices: np.ndarray) -> Iterator[slice]:
    """Slice ranges of the batch axis that keep each batch under ``_BATCH_BYTES``."""
    per = max(1, int(np.prod(slices.shape[1:])) * 8)
    step = max(1, _BATCH_BYTES // per)
    for start in range(0, slices.shape[0], step):
        yield slice(start, min(start + step, slices.shape[0]))


def run_batched(slices: np.ndarray, xp: Any, fn: Callable[[Any], tuple[Any, dict]]) -> tuple[np.ndarray, list[dict]]:
    """Apply ``fn`` (batch on ``xp`` -> (images on ``xp``, stats)) to every batch; numpy out."""
    out, stats = [], []
    ranges = list(batches(slices))
    log.debug("%d slices in %d batches on %s", slices.shape[0], len(ranges), getattr(xp, "__name__", xp))
    for sl in ranges:
        batch = xp.asarray(np.ascontiguousarray(slices[sl]), dtype=xp.complex64)
        images, info = fn(batch)
        out.append(to_numpy(images).astype(np.float32, copy=False))
        stats.append(info)
    return np.concatenate(out, axis=0), stats


def recon_crop(kspace: KSpace, tool: str) -> tuple[int, int, int, int]:
    """``KSpace.recon_crop`` with a typed error naming the tool."""
    try:
        return kspace.recon_crop
    except (ValueError, TypeError) as e:
        raise ToolError(ErrorCode.shape, f"{tool}: {e}", hint="meta['recon_matrix'] must be [x, y] within "
                        "the k-space matrix (ISMRMRD reconSpace)", arg="kspace") from e


def to_artifact(images: np.ndarray, kspace: KSpace, data_shape: tuple[int, ...], cine: bool,
                meta: dict[str, Any]) -> Image | Cine:
    """Coil-combined slices -> Image/Cine on the recon grid, with audit meta.

    The image is cropped to the header's recon matrix (``KSpace.recon_crop``: readout
    oversampling removed, centre crop as fastMRI's ``reconstruction_rss``) after coil
    combination, and placed on ``KSpace.recon_affine``.
    """
    x0, y0, rx, ry = recon_crop(kspace, str(meta.get("method", "recon")))
    vol = from_slices(images, data_shape)[x0:x0 + rx, y0:y0 + ry]
    full_meta = {**{k: v for k, v in kspace.meta.items() if k in ("case_id", "sequence")}, **meta,
                 "encoded_matrix": list(kspace.encoded_matrix), "recon_matrix": [rx, ry]}
    cls = Cine if cine else Image
    return cls(np.ascontiguousarray(vol), kspace.recon_affine, full_meta)
