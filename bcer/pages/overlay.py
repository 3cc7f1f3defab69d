"""Thumbnails for case pages: a slice of an input volume with masks and lesion boxes drawn on it.

Every overlay is placed through world coordinates (the affines), never by voxel index, so a
mask on another grid (ADC vs T2w, a resampled segmentation) lands where it belongs. Slices
are shown axially in radiological convention (patient right on the viewer's left), from the
volume reoriented to RAS. Images are small palette PNGs (numpy + Pillow, no matplotlib), so a
200-case cohort's pages stay within a few tens of MB and render quickly.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

log = logging.getLogger(__name__)
LABEL_RGB = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (255, 225, 25), (245, 130, 48), (145, 30, 180),
             (70, 240, 240), (240, 50, 230)]
BOX_RGB = (255, 255, 0)


@dataclass
class Volume:
    """A 3-D (or 4-D, time last) array with its voxel-to-world affine."""

    data: np.ndarray
    affine: np.ndarray
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def frame(self, t: int | None) -> "Volume":
        if self.data.ndim == 4:
            t = 0 if t is None else int(np.clip(t, 0, self.data.shape[3] - 1))
            return Volume(np.asarray(self.data[..., t]), self.affine, f"{self.name} frame {t}")
        return self


def canonical(vol: Volume) -> Volume:
    """The volume reoriented to RAS (axis order and flips only; no resampling)."""
    import nibabel as nib

    img = nib.as_closest_canonical(nib.Nifti1Image(np.asarray(vol.data), np.asarray(vol.affine, np.float64)))
    return Volume(np.asarray(img.dataobj), np.asarray(img.affine), vol.name, vol.meta)


def world_to_voxel(affine: np.ndarray, xyz: np.ndarray) -> np.ndarray:
    """(N, 3) world points -> (N, 3) continuous voxel coordinates of ``affine``."""
    inv = np.linalg.inv(np.asarray(affine, np.float64))
    return xyz @ inv[:3, :3].T + inv[:3, 3]


def slice_axis(vol: Volume) -> int:
    """The axis to slice a RAS volume along: its thickest one (the acquisition's slice axis, e.g.
    a cardiac short-axis stack), else z (axial)."""
    zooms = np.sqrt((np.asarray(vol.affine)[:3, :3] ** 2).sum(axis=0))
    thick = int(np.argmax(zooms))
    return thick if zooms[thick] > 1.5 * float(np.median(zooms)) else 2


def slice_world(base: Volume, k: int, axis: int = 2) -> np.ndarray:
    """World coordinates (A, B, 3) of the voxel centres of slice ``k`` along ``axis`` of a RAS
    volume (A, B: the two other axes in increasing order)."""
    dims = [d for i, d in enumerate(base.data.shape[:3]) if i != axis]
    a_idx, b_idx = np.meshgrid(np.arange(dims[0]), np.arange(dims[1]), indexing="ij")
    cols = [a_idx, b_idx]
    cols.insert(axis, np.full_like(a_idx, k))
    vox = np.stack(cols, axis=-1).reshape(-1, 3).astype(np.float64)
    aff = np.asarray(base.affine, np.float64)
    return (vox @ aff[:3, :3].T + aff[:3, 3]).reshape(dims[0], dims[1], 3)


def sample_nearest(vol: Volume, xyz: np.ndarray) -> np.ndarray:
    """``vol`` sampled (nearest voxel) at world points ``xyz`` (..., 3); 0 outside its grid."""
    shape = xyz.shape[:-1]
    v = np.rint(world_to_voxel(vol.affine, xyz.reshape(-1, 3))).astype(np.int64)
    dims = np.asarray(vol.data.shape[:3])
    inside = np.all((v >= 0) & (v < dims), axis=1)
    out = np.zeros(v.shape[0], dtype=np.asarray(vol.data).dtype)
    vi = v[inside]
    out[inside] = np.asarray(vol.data)[vi[:, 0], vi[:, 1], vi[:, 2]]
    return out.reshape(shape)


def best_slice(base: Volume, masks: Sequence[Volume], boxes: Sequence[Any] = (), axis: int = 2) -> int:
    """The slice of ``base`` (RAS) along ``axis`` through the first box's centre, else the one
    that shows the most mask voxels, else the middle slice."""
    nz = base.data.shape[axis]
    for box in boxes:
        centre = (np.asarray(box[0], float) + np.asarray(box[1], float)) / 2
        k = int(np.rint(world_to_voxel(base.affine, centre[None])[0, axis]))
        if 0 <= k < nz:
            return k
    counts = np.zeros(nz)
    for m in masks:
        idx = np.argwhere(np.asarray(m.data) > 0)
        if idx.size == 0:
            continue
        idx = idx[:: max(1, len(idx) // 20000)]  # a sample is enough to find the fullest slice
        xyz = idx[:, :3] @ np.asarray(m.affine)[:3, :3].T + np.asarray(m.affine)[:3, 3]
        k = np.rint(world_to_voxel(base.affine, xyz)[:, axis]).astype(int)
        k = k[(k >= 0) & (k < nz)]
        counts += np.bincount(k, minlength=nz)[:nz]
    return int(np.argmax(counts)) if counts.any() else nz // 2


STRIP_MAX = 7  # slices in one strip: enough to see a structure's extent, small enough for a page


def _mask_slices(base: Volume, masks: Sequence[Volume], axis: int) -> np.ndarray:
    """The slice indices of ``base`` (RAS) along ``axis`` that hold mask voxels (a sample)."""
    nz, found = base.data.shape[axis], []
    for m in masks:
        idx = np.argwhere(np.asarray(m.data) > 0)
        if idx.size == 0:
            continue
        idx = idx[:: max(1, len(idx) // 20000)]
        xyz = idx[:, :3] @ np.asarray(m.affine)[:3, :3].T + np.asarray(m.affine)[:3, 3]
        k = np.rint(world_to_voxel(base.affine, xyz)[:, axis]).astype(int)
        found.append(k[(k >= 0) & (k < nz)])
    return np.concatenate(found) if found else np.zeros(0, int)


def strip_slices(base: Volume, masks: Sequence[Volume], boxes: Sequence[Any] = (), axis: int = 2,
                 n: int = 5) -> list[int]:
    """The slices of a strip: every slice a box touches, else ``n`` evenly spaced slices from the
    first to the last slice the masks reach; ``best_slice`` alone when there is neither. At most
    ``STRIP_MAX`` slices (evenly subsampled), in order."""
    nz = base.data.shape[axis]
    ks: set[int] = set()
    for box in boxes:
        ends = world_to_voxel(base.affine, np.asarray([box[0], box[1]], float))[:, axis]
        lo, hi = int(np.ceil(ends.min() - 0.5)), int(np.floor(ends.max() + 0.5))
        ks.update(range(max(0, lo), min(nz - 1, hi) + 1))
    if not ks:
        k = _mask_slices(base, masks, axis)
        if k.size:
            ks.update(int(round(v)) for v in np.linspace(k.min(), k.max(), min(n, k.max() - k.min() + 1)))
    if not ks:
        return [best_slice(base, masks, boxes, axis)]
    out = sorted(ks)
    if len(out) > STRIP_MAX:
        out = [out[int(round(i))] for i in np.linspace(0, len(out) - 1, STRIP_MAX)]
    return out


def render_strip(base: Volume, ks: Sequence[int], masks: Sequence[Volume] = (), boxes: Sequence[Any] = (),
                 size: int = 240, window: tuple[float, float] | None = None, axis: int = 2, gap: int = 3) -> "Any":
    """Slices ``ks`` of ``base`` side by side (each as :func:`render_slice` draws it), one
    window for all, so intensities compare across the strip."""
    from PIL import Image as PILImage

    window = window or _window(base.data)
    tile = size if len(ks) == 1 else max(96, int(size * 0.6))
    tiles = [render_slice(base, k, masks, boxes, tile, window, axis) for k in ks]
    out = PILImage.new("RGB", (sum(t.width for t in tiles) + gap * (len(tiles) - 1), max(t.height for t in tiles)),
                       (255, 255, 255))
    x = 0
    for t in tiles:
        out.paste(t, (x, 0))
        x += t.width + gap
    return out


def _window(data: np.ndarray) -> tuple[float, float]:
    d = np.abs(np.asarray(data, np.float64)) if np.iscomplexobj(data) else np.asarray(data, np.float64)
    sample = d.ravel()[:: max(1, d.size // 200000)]
    sample = sample[np.isfinite(sample)]
    if sample.size == 0:
        return 0.0, 1.0
    lo, hi = np.percentile(sample, [1, 99.5])
    return float(lo), float(hi if hi > lo else lo + 1.0)


def _box_outline(world_box: Any, xyz: np.ndarray, base: Volume) -> np.ndarray:
    """Pixels of the slice on the outline of an axis-aligned world box (when the slice cuts it)."""
    lo = np.minimum(np.asarray(world_box[0], float), np.asarray(world_box[1], float))
    hi = np.maximum(np.asarray(world_box[0], float), np.asarray(world_box[1], float))
    tol = np.abs(np.asarray(base.affine)[:3, :3]).sum(axis=1) / 2  # half a voxel in each world axis
    inside = np.all((xyz >= lo - tol) & (xyz <= hi + tol), axis=-1)
    if not inside.any():
        return inside
    from scipy import ndimage as ndi

    return inside & ~ndi.binary_erosion(inside)


def render_slice(base: Volume, k: int, masks: Sequence[Volume] = (), boxes: Sequence[Any] = (),
                 size: int = 240, window: tuple[float, float] | None = None, axis: int = 2) -> "Any":
    """An RGB Pillow image of slice ``k`` along ``axis`` of ``base`` (RAS) with masks (filled,
    outlined) and world boxes. Axial: patient right on the viewer's left, anterior up; coronal:
    right on the left, superior up; sagittal: anterior on the left, superior up."""
    from PIL import Image as PILImage
    from scipy import ndimage as ndi

    data = np.take(np.asarray(base.data), k, axis=axis)
    data = np.abs(data) if np.iscomplexobj(data) else data.astype(np.float64)
    lo, hi = window or _window(base.data)
    grey = np.clip((data - lo) / (hi - lo), 0, 1)
    rgb = np.repeat((grey * 255)[..., None], 3, axis=-1)
    xyz = slice_world(base, k, axis)
    for m in masks:
        lab = sample_nearest(m, xyz).astype(np.int64)
        for value in np.unique(lab[lab > 0])[:16]:
            region = lab == value
            colour = np.asarray(LABEL_RGB[(int(value) - 1) % len(LABEL_RGB)], float)
            rgb[region] = 0.6 * rgb[region] + 0.4 * colour
            edge = region & ~ndi.binary_erosion(region)
            rgb[edge] = colour
    for box in boxes:
        rgb[_box_outline(box, xyz, base)] = BOX_RGB
    # (A, B) array, A and B the in-plane RAS axes in order: B is drawn upwards (anterior or
    # superior), A across, flipped so that right (or anterior, sagittal) is on the viewer's left
    img = np.flipud(np.transpose(rgb, (1, 0, 2)))[:, ::-1]
    zooms = np.sqrt((np.asarray(base.affine)[:3, :3] ** 2).sum(axis=0))
    za, zb = [z for i, z in enumerate(zooms) if i != axis]
    h_mm, w_mm = img.shape[0] * zb, img.shape[1] * za
    scale = size / max(h_mm, w_mm)
    out = PILImage.fromarray(img.astype(np.uint8), "RGB")
    return out.resize((max(1, round(w_mm * scale)), max(1, round(h_mm * scale))), PILImage.NEAREST)


def save_png(img: Any, path: Path) -> Path:
    """Write a small palette PNG (written to a temp name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    img.quantize(colors=128).save(tmp, format="PNG", optimize=True)
    tmp.replace(path)
    return path


__all__ = ["Volume", "best_slice", "canonical", "render_slice", "render_strip", "sample_nearest", "save_png",
           "slice_axis", "slice_world", "strip_slices", "world_to_voxel"]
