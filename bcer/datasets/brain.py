"""BraTS-like brain tumour phantoms (T1, T1c, T2, FLAIR) on real MNI152 anatomy.

Anatomy: nilearn ships the MNI152 (2009) GM/WM probability maps and brain mask, usable
offline; CSF is what the brain mask holds beyond GM + WM. Each contrast maps the tissue
fractions to its own intensities (partial-volume mixing), so contrast ordering is realistic:
CSF dark on T1/FLAIR and bright on T2, WM brighter than GM on T1 and darker on T2.

Tumour: an ellipsoid whose normalised radius is modulated by a smooth random field, giving
an irregular blob with nested regions: necrotic core (label 1), enhancing rim (label 4,
high grade only) and oedema (label 2), kept inside brain tissue on one side of the midline.
Labels are made on the output grid itself, so the stated volumes are exact counts of that
grid's voxels.

Everything is sampled onto a grid with a non-identity orientation (oblique, flipped axes),
anisotropic voxels and a non-square matrix, so tools that ignore the affine fail tests.

Families (``family=``; ranges in :data:`FAMILY_RANGES`, one table): ``"base"`` is the phantom
above, unchanged; ``"randomised"`` (for tuning and training) draws voxel size, field of
view, obliquity (and sometimes a sagittal/coronal acquisition: permuted axes), brain
position, per-tissue contrast, intensity scale, noise, bias and tumour size; ``"heldout"``
draws other ranges (stronger obliquity, always a permuted acquisition, coarser or finer
voxels, tumours smaller or larger than the randomised ones, stronger noise and bias,
scanner-unit scales). **Nothing is ever tuned on the held-out family**; it only measures.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage

from ..contracts.artifacts import Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import vox2world, world2vox
from ..tools.resample import sample_on_grid
from .degrade import bias_field, move_image, rician_noise, rigid_matrix, rigid_params
from .geometry import make_affine, random_direction, world_coords
from .phantom import Phantom, Size

log = logging.getLogger(__name__)

__all__ = ["make_brain", "CONTRASTS", "SEG_LABELS", "TISSUE_INTENSITY", "TUMOUR_INTENSITY"]

CONTRASTS = ("T1", "T1c", "T2", "FLAIR")
SEG_LABELS = {1: "necrotic_core", 2: "oedema", 4: "enhancing"}
SCALE = 1000.0  # intensities in scanner-like units

# Relative intensity of each tissue per contrast (columns: background, CSF, GM, WM).
TISSUE_INTENSITY: dict[str, tuple[float, float, float, float]] = {
    "T1": (0.0, 0.25, 0.60, 0.85),
    "T1c": (0.0, 0.27, 0.62, 0.86),
    "T2": (0.0, 1.00, 0.62, 0.45),
    "FLAIR": (0.0, 0.12, 0.70, 0.55),
}
# Tumour compartments per contrast; "core_lgg" is the non-enhancing core of low-grade tumours.
TUMOUR_INTENSITY: dict[str, dict[str, float]] = {
    "necrotic": {"T1": 0.22, "T1c": 0.15, "T2": 0.95, "FLAIR": 0.45},
    "core_lgg": {"T1": 0.40, "T1c": 0.42, "T2": 0.88, "FLAIR": 0.85},
    "oedema": {"T1": 0.45, "T1c": 0.50, "T2": 0.90, "FLAIR": 1.00},
    "enhancing": {"T1": 0.50, "T1c": 1.25, "T2": 0.70, "FLAIR": 0.80},
}
# Nested thresholds on the normalised, field-modulated radius d (d < 1 is whole tumour).
_HGG_CUTS = {"necrotic": 0.45, "enhancing": 0.7}
_LGG_CUTS = {"core": 0.6}

_GRIDS = {  # size -> (MNI resolution mm, in-plane spacing range, slice spacing range, FOV mm)
    "small": (2, (3.2, 3.6), (3.8, 4.4), (176.0, 208.0, 156.0)),
    "full": (1, (0.94, 1.0), (1.0, 1.2), (176.0, 208.0, 156.0)),
}
_BRAIN_CENTRE = np.array([0.0, -18.0, 10.0])  # MNI mm, middle of the brain mask's extent

FAMILIES = ("base", "randomised", "heldout")


@dataclass(frozen=True)
class FamilyRanges:
    """Parameter ranges of one brain phantom family (uniform draws unless said otherwise)."""

    inplane_mm: dict[str, tuple[float, float]]   # per size
    through_mm: dict[str, tuple[float, float]]   # per size
    fov_scale: tuple[float, float]               # field of view relative to the base one
    oblique_deg: tuple[float, float]
    permute: float                               # probability of a sagittal/coronal acquisition
    centre_mm: float                             # brain offset from the FOV centre (each axis, +-)
    contrast_jitter: float                       # relative jitter of every tissue/tumour level
    intensity_scale: tuple[float, float]         # log-uniform, per contrast
    noise: tuple[float, float]                   # Rician sigma / 99th brain percentile
    bias: tuple[float, float]                    # peak |log| bias field
    tumour_scale: tuple[tuple[float, float], ...]  # tumour size factor ranges (one is drawn)


FAMILY_RANGES: dict[str, FamilyRanges] = {
    "randomised": FamilyRanges(
        inplane_mm={"small": (3.0, 3.8), "full": (0.9, 1.1)}, through_mm={"small": (3.5, 5.0), "full": (1.0, 1.5)},
        fov_scale=(1.0, 1.25), oblique_deg=(0.0, 20.0), permute=0.3, centre_mm=10.0, contrast_jitter=0.1,
        intensity_scale=(0.3, 3.0), noise=(0.0, 0.05), bias=(0.0, 0.3), tumour_scale=((0.8, 1.15),)),
    "heldout": FamilyRanges(
        inplane_mm={"small": (3.8, 4.2), "full": (1.1, 1.25)}, through_mm={"small": (5.0, 6.0), "full": (1.5, 2.0)},
        fov_scale=(1.25, 1.4), oblique_deg=(20.0, 30.0), permute=1.0, centre_mm=18.0, contrast_jitter=0.15,
        intensity_scale=(5.0, 40.0), noise=(0.05, 0.08), bias=(0.3, 0.45), tumour_scale=((0.65, 0.8), (1.15, 1.3))),
}


_MNI_FILES = {"t1": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
              "gm": "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
              "wm": "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz"}


def _mni_1mm() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The 1 mm MNI152 (2009a) T1, GM and WM images nilearn ships, read with nibabel.

    Reading the files directly skips importing ``nilearn.datasets`` (which pulls in
    scikit-learn, seconds on a small machine); the public loaders are the fallback.
    """
    import importlib.util

    import nibabel as nib

    spec = importlib.util.find_spec("nilearn")
    folder = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" if spec else None
    if folder is not None and all((folder / f).exists() for f in _MNI_FILES.values()):
        imgs = {k: nib.load(str(folder / f)) for k, f in _MNI_FILES.items()}
    else:
        try:
            from nilearn import datasets
        except ImportError as e:  # pragma: no cover - nilearn is a core dependency
            raise ToolError(ErrorCode.resource, "nilearn's MNI152 templates are needed for brain "
                            "anatomy", hint="pip install nilearn") from e
        imgs = {"t1": datasets.load_mni152_template(1), "gm": datasets.load_mni152_gm_template(1),
                "wm": datasets.load_mni152_wm_template(1)}
    data = {k: np.asarray(im.dataobj, dtype=np.float32) for k, im in imgs.items()}
    return data, np.asarray(imgs["gm"].affine, dtype=np.float64)


def _block_mean(x: np.ndarray, f: int) -> np.ndarray:
    n = [s // f for s in x.shape]
    x = x[: n[0] * f, : n[1] * f, : n[2] * f]
    return x.reshape(n[0], f, n[1], f, n[2], f).mean(axis=(1, 3, 5))


@lru_cache(maxsize=2)
def _mni_tissues(resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """(4, X, Y, Z) float32 fractions [background, CSF, GM, WM] and their affine.

    The brain is nilearn's own definition (rescaled T1 template > 0.2); CSF is what it holds
    beyond GM + WM. Coarser resolutions are exact block means of the 1 mm fractions.
    """
    data, affine = _mni_1mm()
    brain = (data["t1"] / data["t1"].max() > 0.2).astype(np.float32)
    # the shipped probability maps are scaled 0..255 (nilearn's loaders rescale them too)
    gm = np.clip(data["gm"] / data["gm"].max(), 0, 1) * brain
    wm = np.clip(data["wm"] / data["wm"].max(), 0, 1) * brain
    over = np.clip(gm + wm, 1.0, None)  # GM+WM may exceed 1 near boundaries: renormalise
    gm, wm = gm / over, wm / over
    csf = np.clip(brain - gm - wm, 0.0, 1.0)
    frac = [1.0 - brain, csf, gm, wm]
    if resolution > 1:
        frac = [_block_mean(f, resolution) for f in frac]
        scale = np.diag([resolution, resolution, resolution, 1.0]).astype(np.float64)
        scale[:3, 3] = (resolution - 1) / 2.0  # new voxel 0 sits at the centre of the block
        affine = affine @ scale
    return np.stack(frac).astype(np.float32), affine


def _grid(rng: np.random.Generator, size: str, oblique: bool,
          fam: FamilyRanges | None = None) -> tuple[np.ndarray, tuple[int, ...]]:
    _, inplane, through, fov = _GRIDS[size]
    if fam is not None:
        inplane, through = fam.inplane_mm[size], fam.through_mm[size]
        fov = tuple(f * rng.uniform(*fam.fov_scale) for f in fov)
    sp = (rng.uniform(*inplane),) * 2 + (rng.uniform(*through),)
    shape = tuple(int(round(f / s)) for f, s in zip(fov, sp))
    if shape[0] == shape[1]:  # keep the matrix non-square
        shape = (shape[0], shape[1] + 1, shape[2])
    if fam is None:
        direction = random_direction(rng, oblique_deg=12.0, flips=True) if oblique else np.eye(3)
        centre = _BRAIN_CENTRE + rng.uniform(-4, 4, size=3)
    else:
        direction = random_direction(rng, oblique_deg=rng.uniform(*fam.oblique_deg), flips=True,
                                     permute=bool(rng.random() < fam.permute))
        centre = _BRAIN_CENTRE + rng.uniform(-fam.centre_mm, fam.centre_mm, size=3)
    return make_affine(direction, sp, shape, centre), shape


def _sample_tissues(resolution: int, affine: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(4, X, Y, Z) tissue fractions on the output grid.

    Only the part of the grid that can see the brain is interpolated, and background is
    1 - (CSF + GM + WM) (fractions sum to one and linear interpolation keeps that), which
    halves the cost at 1 mm.
    """
    mni_frac, mni_affine = _mni_tissues(resolution)
    lo, hi = _brain_box(resolution)
    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    ijk = world2vox(affine, vox2world(mni_affine, corners))
    a = np.clip(np.floor(ijk.min(axis=0)).astype(int) - 1, 0, np.array(shape))
    b = np.clip(np.ceil(ijk.max(axis=0)).astype(int) + 2, 0, np.array(shape))
    frac = np.zeros((4,) + tuple(shape), dtype=np.float32)
    if np.all(b > a):
        crop = tuple(slice(int(x), int(y)) for x, y in zip(a, b))
        sub = affine.copy()
        sub[:3, 3] = vox2world(affine, a)
        for t in (1, 2, 3):
            frac[t][crop] = sample_on_grid(mni_frac[t], mni_affine, sub, tuple(b - a), order=1)
    frac[0] = np.clip(1.0 - frac[1:].sum(axis=0), 0.0, 1.0)
    return frac


@lru_cache(maxsize=2)
def _brain_box(resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """Voxel bounding box (inclusive) of the MNI brain at ``resolution``."""
    ijk = np.argwhere(_mni_tissues(resolution)[0][0] < 1.0)
    return ijk.min(axis=0), ijk.max(axis=0)


@lru_cache(maxsize=8)
def _centre_candidates(side: str, radius: float) -> np.ndarray:
    """World points (N, 3) that are WM-rich, in the chosen hemisphere, and deep enough.

    Found on the 2 mm anatomy for every size: candidates are world points, and the distance
    transform at 1 mm would cost seconds for no benefit.
    """
    fractions, mni_affine = _mni_tissues(2)
    depth = ndimage.distance_transform_edt(fractions[0] < 0.5) * abs(mni_affine[0, 0])
    ijk = np.argwhere((fractions[3] > 0.7) & (depth > 0.8 * radius))
    world = ijk @ mni_affine[:3, :3].T + mni_affine[:3, 3]
    x = world[:, 0] if side == "right" else -world[:, 0]  # RAS: +x is the patient's right
    ok = (x > 18.0) & (x < 48.0) & (world[:, 2] > -20.0) & (world[:, 2] < 50.0)
    if not np.any(ok):
        raise ToolError(ErrorCode.internal, f"no room for a tumour of radius {radius:.0f} mm "
                        f"in the {side} hemisphere", hint="use a smaller tumour")
    return world[ok]


def _tumour_centre(rng: np.random.Generator, side: str, radius: float) -> np.ndarray:
    cands = _centre_candidates(side, radius)
    return cands[rng.integers(len(cands))]


def _tumour_distance(rng: np.random.Generator, affine: np.ndarray, shape: tuple[int, ...],
                     centre: np.ndarray, radii: np.ndarray
                     ) -> tuple[np.ndarray, tuple[slice, ...], np.ndarray]:
    """Field-modulated normalised radius on the crop of the grid that can hold the tumour,
    the crop, and the world x of the crop's voxels."""
    reach = 1.6 * float(radii.max())
    corners = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    ijk = (centre + reach * corners - affine[:3, 3]) @ np.linalg.inv(affine[:3, :3]).T
    lo = np.clip(np.floor(ijk.min(0)).astype(int), 0, np.array(shape) - 1)
    hi = np.clip(np.ceil(ijk.max(0)).astype(int) + 1, 1, np.array(shape))
    crop = tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))
    sub = affine.copy()
    sub[:3, 3] = affine[:3, :3] @ lo + affine[:3, 3]
    rel = world_coords(sub, tuple(int(b - a) for a, b in zip(lo, hi))) - centre
    rot = random_direction(rng, oblique_deg=90.0, flips=False)
    local = rel @ rot / radii  # ellipsoid with random axes
    # A smooth random field (on a 2 mm box around the tumour) makes the boundary irregular.
    n = int(np.ceil(2 * reach / 2.0)) + 1
    box = make_affine(np.eye(3), (2.0, 2.0, 2.0), (n, n, n), centre)
    field = ndimage.gaussian_filter(rng.normal(size=(n, n, n)), sigma=3.0)
    field /= field.std() or 1.0
    f = sample_on_grid(field.astype(np.float32), box, sub, local.shape[:3], order=1)
    d = np.linalg.norm(local, axis=-1) * (1.0 + 0.22 * np.clip(f, -2.5, 2.5))
    return d.astype(np.float32), crop, rel[..., 0] + centre[0]


def _tumour_labels(rng: np.random.Generator, affine: np.ndarray, shape: tuple[int, ...],
                   brain: np.ndarray, grade: str, side: str, centre: np.ndarray, scale: float = 1.0) -> np.ndarray:
    radii = (rng.uniform(26, 34) if grade == "HGG" else rng.uniform(18, 26)) * rng.uniform(0.8, 1.15, 3) * scale
    d, crop, xw = _tumour_distance(rng, affine, shape, centre, radii)
    inside = (brain[crop] > 0) & ((xw > 2.0) if side == "right" else (xw < -2.0))
    sub = np.zeros(d.shape, dtype=np.int16)
    sub[(d < 1.0) & inside] = 2
    if grade == "HGG":
        sub[(d < _HGG_CUTS["enhancing"]) & inside] = 4
        sub[(d < _HGG_CUTS["necrotic"]) & inside] = 1
    else:
        sub[(d < _LGG_CUTS["core"]) & inside] = 1
    seg = np.zeros(shape, dtype=np.int16)
    seg[crop] = sub
    return seg


def _contrast(name: str, fractions: np.ndarray, seg: np.ndarray, grade: str,
              levels: dict[str, Any] | None = None) -> np.ndarray:
    """One contrast from tissue fractions and tumour labels; ``levels`` (a family's jittered
    ``{"tissue": ..., "tumour": ..., "scale": ...}``) replaces the base tables."""
    tissue, tumour, scale = ((TISSUE_INTENSITY, TUMOUR_INTENSITY, SCALE) if levels is None else
                             (levels["tissue"], levels["tumour"], SCALE * levels["scale"][name]))
    w = np.asarray(tissue[name], dtype=np.float32)
    img = np.tensordot(w, fractions, axes=1)
    core = "necrotic" if grade == "HGG" else "core_lgg"
    for label, comp in ((2, "oedema"), (4, "enhancing"), (1, core)):
        img[seg == label] = tumour[comp][name]
    return (img * scale).astype(np.float32)


def _family_levels(rng: np.random.Generator, fam: FamilyRanges) -> dict[str, Any]:
    """Jittered tissue/tumour levels and a per-contrast intensity scale for a family case."""
    j = fam.contrast_jitter
    tissue = {c: tuple(float(v * rng.uniform(1 - j, 1 + j)) for v in vals) for c, vals in TISSUE_INTENSITY.items()}
    tumour = {k: {c: float(v * rng.uniform(1 - j, 1 + j)) for c, v in d.items()} for k, d in TUMOUR_INTENSITY.items()}
    lo, hi = np.log(fam.intensity_scale[0]), np.log(fam.intensity_scale[1])
    return {"tissue": tissue, "tumour": tumour, "scale": {c: float(np.exp(rng.uniform(lo, hi))) for c in CONTRASTS}}


def _misalign(rng: np.random.Generator, images: dict[str, Image], centre: np.ndarray) -> dict[str, Any]:
    """Move one non-T1c contrast by a known rigid transform (see ``degrade`` for direction)."""
    which = str(rng.choice(["T1", "T2", "FLAIR"]))
    rot = rng.uniform(3.0, 7.0, 3) * rng.choice([-1.0, 1.0], 3)
    trans = rng.uniform(3.0, 7.0, 3) * rng.choice([-1.0, 1.0], 3)
    m = rigid_matrix(rot, trans, centre)
    images[which] = move_image(images[which], m, order=1)
    return {"contrast": which, "matrix": m.tolist(), **rigid_params(m, centre),
            "direction": "moved(M @ p) == aligned(p): M maps aligned/fixed world points to "
                         "misaligned/moving ones (ITK fixed->moving)"}


def _volumes(seg: Mask, brain: Mask) -> dict[str, Any]:
    v = {lab: seg.volume_ml(lab) for lab in SEG_LABELS}
    vox = seg.voxel_volume_ml
    wt = np.count_nonzero(seg.data) * vox
    tc = np.count_nonzero((seg.data == 1) | (seg.data == 4)) * vox
    world = vox2world(seg.affine, np.argwhere(seg.data > 0))
    return {"volumes_ml": {str(k): float(x) for k, x in v.items()},
            "necrotic_ml": float(v[1]), "oedema_ml": float(v[2]), "enhancing_ml": float(v[4]),
            "WT_ml": float(wt), "TC_ml": float(tc), "ET_ml": float(v[4]),
            "centroid_world": [float(c) for c in world.mean(axis=0)],
            "brain_ml": float(brain.volume_ml(1)), "voxel_ml": float(vox)}


def _check_args(case_id: str, size: str, grade: str | None, side: str | None, family: str = "base") -> None:
    for arg, value, ok in (("size", size, _GRIDS), ("grade", grade, ("HGG", "LGG", None)),
                           ("side", side, ("left", "right", None)), ("family", family, FAMILIES)):
        if value not in ok:
            raise ToolError(ErrorCode.value_range, f"{arg}={value!r} is not one of {list(ok)}",
                            arg=arg, case=case_id)


def make_brain(case_id: str, seed: int, size: Size = "small", grade: str | None = None,
               side: str | None = None, noise: float | None = None, bias: float | None = None,
               misalign: bool = False, oblique: bool = True, family: str = "base") -> Phantom:
    """One BraTS-like case: T1, T1c, T2, FLAIR, tumour label map and exact truth.

    Args:
        case_id: the case id (stored in the phantom).
        seed: everything random derives from it; same seed, same case.
        size: "small" (~3.5 x 3.5 x 4 mm voxels, < 1 s) or "full" (~1 mm, realistic).
        grade: "HGG" (enhancing rim, label 4) or "LGG" (no label 4); random when None.
        side: "left" or "right" hemisphere (RAS x < 0 is left); random when None.
        noise: Rician noise sigma as a fraction of each contrast's 99th brain percentile
            (None: 0 for the base family, the family's range otherwise).
        bias: bias-field strength (peak |log field|); 0 disables it (None: as ``noise``).
        misalign: move one of T1/T2/FLAIR by a known rigid transform (recorded in truth).
        oblique: oblique, flipped grid axes (else the identity direction; base family only).
        family: ``base`` | ``randomised`` | ``heldout`` (module docstring; never tune on ``heldout``).

    Returns:
        Phantom with sequences ``T1, T1c, T2, FLAIR`` (Image), labels ``seg`` (0/1/2/4) and
        ``brain`` (0/1), ``references`` the clean contrasts (before misalignment, bias and
        noise, on the same grid) and ``truth`` (grade, side, per-label/WT/TC/ET volumes in
        mL, tumour centroid in world RAS mm, brain volume, degradations applied).
    """
    _check_args(case_id, size, grade, side, family)
    rng = np.random.default_rng(seed)
    grade = grade or str(rng.choice(["HGG", "LGG"]))
    side = side or str(rng.choice(["left", "right"]))
    fam = FAMILY_RANGES.get(family)
    # a family's own draws come from their own stream, so the base draws stay as they were
    frng = np.random.default_rng([seed, 0xB7A1, FAMILIES.index(family)]) if fam else None
    affine, shape = _grid(frng if fam else rng, size, oblique, fam)
    frac = _sample_tissues(_GRIDS[size][0], affine, shape)
    brain = (frac[0] < 0.5).astype(np.int16)
    centre = _tumour_centre(rng, side, 28.0 if grade == "HGG" else 22.0)
    scale = 1.0
    if fam:
        lo, hi = fam.tumour_scale[int(frng.integers(len(fam.tumour_scale)))]
        scale = float(frng.uniform(lo, hi))
    seg = _tumour_labels(rng, affine, shape, brain, grade, side, centre, scale)
    levels = _family_levels(frng, fam) if fam else None
    if fam:
        noise = float(frng.uniform(*fam.noise)) if noise is None else noise
        bias = float(frng.uniform(*fam.bias)) if bias is None else bias
    noise, bias = noise or 0.0, bias or 0.0
    clean = {c: Image(_contrast(c, frac, seg, grade, levels), affine.copy(), {"sequence": c}) for c in CONTRASTS}
    seg_mask = Mask(seg, affine.copy(), {"case": case_id}, labels=dict(SEG_LABELS))
    brain_mask = Mask(brain, affine.copy(), {"case": case_id}, labels={1: "brain"})
    truth: dict[str, Any] = {"grade": grade, "side": side, "size": size, "seed": int(seed),
                             **_volumes(seg_mask, brain_mask)}
    images = {c: Image(im.data.copy(), im.affine.copy(), dict(im.meta)) for c, im in clean.items()}
    truth["misalignment"] = _misalign(rng, images, np.asarray(truth["centroid_world"])) if misalign else None
    if bias > 0:
        for c in CONTRASTS:
            images[c].data = images[c].data * bias_field(shape, rng, bias)
    sigmas = {}
    if noise > 0:
        for c in CONTRASTS:
            sigmas[c] = float(noise * np.percentile(clean[c].data[brain > 0], 99))
            images[c].data = rician_noise(images[c].data, sigmas[c], rng)
    truth.update(noise_frac=float(noise), noise_sigma=sigmas, bias_strength=float(bias), family=family)
    if fam:
        truth.update(tumour_scale=scale, intensity_scale=levels["scale"])
    age = int(rng.integers(45, 80) if grade == "HGG" else rng.integers(20, 55))
    return Phantom(case_id=case_id, domain="brain", sequences=images,
                   labels={"seg": seg_mask, "brain": brain_mask},
                   metadata={"age": age, "sex": str(rng.choice(["F", "M"]))},
                   truth=truth, references=clean)
