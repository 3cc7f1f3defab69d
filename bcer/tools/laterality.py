"""Laterality in the patient's frame: which side of the body's midline a region lies on.

The side of a finding is decided against the patient's mid-sagittal plane, never by the
sign of a world coordinate: a scanner's world origin is wherever the table and the file
put it (BraTS 2021 files carry the affine ``diag(-1, -1, 1)`` with origin ``(0, 239, 0)``,
so the brain's midline sits near world x = -120 mm and every voxel has x <= 0).

The plane is fitted to the image's foreground (the head for a brain scan, the brain for a
skull-stripped one, the body for a pelvis): in RAS world millimetres (through the affine, so
flipped, permuted and oblique voxel grids give the same plane), the foreground's outline is
cut into left-right chords (bins of 2 voxels in y and z), and the chord midpoints are fitted
by the plane ``x = a + b*y + c*z`` (weighted by chord length, outliers dropped), which
follows a head that is tilted by a few degrees. Chords that end on the edge of the field of
view are left out; when most wide chords do, the field of view cuts the body and no midline
is given (sides are then left empty rather than guessed).

RAS+: x grows toward the patient's right, so a positive signed distance is the right side.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi

from ..contracts.geometry import spacing, vox2world

log = logging.getLogger(__name__)

_FIT_ROUNDS = 3
_MIN_CHORDS = 8
_MAX_TILT = np.tan(np.radians(30.0))  # a steeper fitted plane is a bad fit, not a tilted head


@dataclass(frozen=True)
class Midline:
    """The mid-sagittal plane ``x = a + b*y + c*z`` in RAS mm, and how it was found."""

    a: float
    b: float = 0.0
    c: float = 0.0
    source: str = ""
    chords: int = 0

    def signed_mm(self, xyz: np.ndarray) -> np.ndarray:
        """Signed distance (mm) of RAS points (N, 3) from the plane: > 0 on the patient's right."""
        p = np.atleast_2d(np.asarray(xyz, np.float64))
        return (p[:, 0] - (self.a + self.b * p[:, 1] + self.c * p[:, 2])) / np.sqrt(1 + self.b ** 2 + self.c ** 2)

    def as_dict(self) -> dict[str, float | str | int]:
        return {"a_mm": self.a, "b": self.b, "c": self.c, "source": self.source, "chords": self.chords}


def _strided(data: np.ndarray, affine: np.ndarray, target_mm: float) -> tuple[np.ndarray, np.ndarray]:
    """Every n-th voxel so that the grid is about ``target_mm`` coarse (the outline is all we need)."""
    steps = [max(1, int(target_mm // s)) for s in spacing(affine)]
    aff = np.asarray(affine, np.float64).copy()
    aff[:3, :3] = aff[:3, :3] * np.asarray(steps, np.float64)
    return data[::steps[0], ::steps[1], ::steps[2]], aff


def foreground(data: np.ndarray) -> np.ndarray:
    """The largest connected region brighter than 10 % of the 99th percentile of the non-zero
    voxels: the head (or the skull-stripped brain, or the body)."""
    finite = np.where(np.isfinite(data), data, 0.0)
    nz = finite[finite > 0]
    if nz.size == 0:
        return np.zeros(data.shape, bool)
    fg = finite > 0.1 * float(np.percentile(nz, 99))
    lab, n = ndi.label(fg)
    if n > 1:
        fg = lab == (int(np.argmax(np.bincount(lab.ravel())[1:])) + 1)
    return fg


def _chords(fg: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Left-right chords of the outline: (midpoints (N, 3) RAS, lengths (N,)), and whether most
    wide chords end on the edge of the grid (the field of view cuts the body)."""
    edge = fg & ~ndi.binary_erosion(fg, border_value=0)
    ijk = np.argwhere(edge)
    shape = np.asarray(fg.shape)
    at_edge = np.any((ijk == 0) | (ijk == shape - 1), axis=1)
    xyz = vox2world(affine, ijk)
    bin_mm = 2.0 * max(spacing(affine))
    keys = np.floor(xyz[:, 1:] / bin_mm).astype(np.int64)
    _, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.ravel()
    order = np.lexsort((xyz[:, 0], inv))
    g = inv[order]
    first = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
    last = np.r_[first[1:] - 1, len(g) - 1]
    lo, hi = order[first], order[last]
    width = xyz[hi, 0] - xyz[lo, 0]
    cut = at_edge[lo] | at_edge[hi]
    wide = width >= 0.5 * width.max() if width.size else np.zeros(0, bool)
    fov_cut = bool(wide.any() and cut[wide].mean() > 0.5)
    ok = ~cut & (width > 0)
    mid = 0.5 * (xyz[lo] + xyz[hi])
    return mid[ok], width[ok], fov_cut


def _fit_plane(mid: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares of x = a + b*y + c*z, refitted without outliers (> 3 robust SD)."""
    keep = np.ones(len(mid), bool)
    coef = np.array([float(np.median(mid[:, 0])), 0.0, 0.0])
    for _ in range(_FIT_ROUNDS):
        A = np.c_[np.ones(keep.sum()), mid[keep, 1], mid[keep, 2]]
        sw = np.sqrt(w[keep])
        coef = np.linalg.lstsq(A * sw[:, None], mid[keep, 0] * sw, rcond=None)[0]
        r = mid[:, 0] - (coef[0] + coef[1] * mid[:, 1] + coef[2] * mid[:, 2])
        mad = 1.4826 * float(np.median(np.abs(r[keep] - np.median(r[keep]))))
        keep = np.abs(r) <= max(3.0 * mad, 1.0)
        if keep.sum() < _MIN_CHORDS:
            break
    if abs(coef[1]) > _MAX_TILT or abs(coef[2]) > _MAX_TILT:
        return float(np.average(mid[:, 0], weights=w)), 0.0, 0.0
    return float(coef[0]), float(coef[1]), float(coef[2])


def midline_from_image(data: np.ndarray, affine: np.ndarray) -> Midline | None:
    """The mid-sagittal plane of an image's foreground, or None where it cannot be found
    (an empty image, a field of view that cuts the body, too few chords).

    >>> import numpy as np
    >>> ijk = np.indices((40, 40, 30)).transpose(1, 2, 3, 0)
    >>> head = (np.linalg.norm((ijk - [19.5, 19.5, 14.5]) / [15, 18, 12], axis=-1) < 1).astype(float)
    >>> aff = np.diag([-4.0, -4.0, 4.0, 1.0]); aff[:3, 3] = (0, 159, 0)  # BraTS-like: all x <= 0
    >>> round(midline_from_image(head, aff).a)  # the head's centre, 19.5 voxels * -4 mm
    -78
    """
    vol = np.asarray(data, np.float64)
    if vol.ndim != 3:
        return None
    small, aff = _strided(vol, affine, 2.0)
    fg = foreground(small)
    if fg.sum() < 50:
        log.info("laterality: no foreground to fit a midline on")
        return None
    mid, w, fov_cut = _chords(fg, aff)
    if fov_cut or len(mid) < _MIN_CHORDS:
        log.info("laterality: %s", "the field of view cuts the body" if fov_cut else "too few chords")
        return None
    a, b, c = _fit_plane(mid, w)
    return Midline(a, b, c, source="image foreground outline", chords=len(mid))


def midline_from_mask(mask: np.ndarray, affine: np.ndarray) -> Midline | None:
    """A sagittal plane through the centroid of a mask (an organ that straddles the midline,
    such as the prostate gland): sides relative to the organ's own centre."""
    ijk = np.argwhere(np.asarray(mask) != 0)
    if len(ijk) == 0:
        return None
    return Midline(float(vox2world(affine, ijk.mean(axis=0))[0]), source="mask centroid", chords=0)


def right_share(ijk: np.ndarray, affine: np.ndarray, midline: Midline) -> float:
    """Share of a region's voxels (indices (N, 3)) on the patient's right of the midline
    (a voxel centre on the plane counts half)."""
    d = midline.signed_mm(vox2world(affine, ijk))
    return float((np.count_nonzero(d > 0) + 0.5 * np.count_nonzero(d == 0)) / max(len(d), 1))


def side_word(share_right: float, bilateral_share: float) -> str:
    """"R", "L", or "bilateral" where each side holds at least ``bilateral_share`` of the region."""
    if share_right >= 1.0 - bilateral_share:
        return "R"
    if share_right <= bilateral_share:
        return "L"
    return "bilateral"


def components(region: np.ndarray, min_voxels: int) -> list[np.ndarray]:
    """Voxel indices of each 26-connected component with at least ``min_voxels`` voxels,
    largest first."""
    lab, n = ndi.label(region, ndi.generate_binary_structure(3, 3))
    if n == 0:
        return []
    sizes = np.bincount(lab.ravel())[1:]
    keep = [i + 1 for i in np.argsort(-sizes, kind="stable") if sizes[i] >= min_voxels]
    objs = ndi.find_objects(lab)
    out = []
    for k in keep:
        sl = objs[k - 1]
        local = np.argwhere(lab[sl] == k)
        out.append(local + np.array([s.start for s in sl]))
    return out


__all__ = ["Midline", "components", "foreground", "midline_from_image", "midline_from_mask", "right_share",
           "side_word"]
