"""Domain randomisation: training images synthesised on the fly from label maps (SynthSeg).

After Billot et al., *SynthSeg* (Medical Image Analysis 2023): a network trained on images
whose look is drawn at random for every sample learns the shapes, not one scanner's
contrast. :func:`synthesise` turns one label map into one random image and its (equally
transformed) label map:

1. **background clutter**: the background (label 0) is split into smooth random regions
   (:func:`clutter`), each of which gets its own intensity, so the network never learns
   "uniform surroundings"; the target labels keep 0 there;
2. **anatomy**: a random affine (rotation, scaling, shear, in millimetres) and a smooth
   elastic displacement field warp the label map (nearest neighbour);
3. **contrast**: a Gaussian mixture, one random mean and SD per label (any contrast order
   occurs, including inverted ones);
4. **acquisition**: a random acquired resolution, slice thickness and slice gap along a random
   slice axis; partial voluming by blurring with each axis's acquired profile (anisotropic
   blur), sampling at the acquired spacing, and interpolation back to the label grid;
5. **scanner**: a smooth multiplicative bias field (MONAI ``RandBiasField``), Rician noise
   (MONAI ``RandRicianNoise``), a random gamma (MONAI ``RandAdjustContrast``), then
   min-max scaling to [0, 1];
6. **geometry**: random axis flips and permutations of the voxel grid and a random field of
   view (crop), applied to image and labels alike, with the affine kept in step so that every
   voxel keeps its world position.

Every draw comes from the ``numpy`` generator passed in (MONAI's transforms are seeded from
it), so a seed reproduces a sample exactly; the draws are returned in ``Synth.params``.

Label maps come from several independent shape sources (:data:`SOURCES`): the cardiac,
prostate and brain phantom generators with their randomised families and every pathology
they draw (dilated, hypertrophic, infarcted hearts and abnormal RVs; glands with 0-2
lesions; high- and low-grade tumours on either side, and two-tumour brains). The evaluation
generators (``cardiac_family``, ``prostate_family``) are deliberately not among them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy import ndimage as ndi

from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import spacing as affine_spacing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RandomiseRanges:
    """The randomisation ranges (fixed before any training; :func:`synthesise` draws in them)."""

    mean: tuple[float, float] = (0.0, 1.0)  # per-label mean intensity
    std: tuple[float, float] = (0.0, 0.08)  # per-label SD (texture within a tissue)
    rotate_deg: float = 15.0  # each axis, uniform in +-
    scale: tuple[float, float] = (0.85, 1.15)  # each axis
    shear: float = 0.05
    elastic_mm: float = 3.0  # SD of the displacement field
    elastic_smooth_mm: float = 20.0  # its correlation length
    inplane_mm: tuple[float, float] = (1.0, 3.0)  # acquired in-plane resolution
    thickness_mm: tuple[float, float] = (1.0, 8.0)  # slice thickness
    gap_mm: tuple[float, float] = (0.0, 2.0)  # gap between slices
    bias: float = 0.12  # MONAI RandBiasField coefficients in +-b, b ~ U(0, bias): max/min field up to ~2.5
    gamma: tuple[float, float] = (0.6, 1.6)
    noise: tuple[float, float] = (0.0, 0.05)  # Rician sigma, fraction of the intensity range
    fov: tuple[float, float] = (0.7, 1.0)  # share of each axis kept
    flip: float = 0.5  # probability per axis
    permute: float = 0.5  # probability of a random axis permutation
    clutter_classes: tuple[int, int] = (2, 6)


RANGES = RandomiseRanges()


@dataclass
class Synth:
    """One synthetic sample: image (float32, [0, 1]), labels (int16), affine, and the draws."""

    image: np.ndarray
    labels: np.ndarray
    affine: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)


def clutter(shape: tuple[int, ...], rng: np.random.Generator, n_classes: int, smooth_vox: float = 6.0) -> np.ndarray:
    """Smooth random regions 1..n (a quantised random field): shapes for the background."""
    f = ndi.gaussian_filter(rng.standard_normal(shape), smooth_vox)
    edges = np.quantile(f, np.linspace(0, 1, n_classes + 1)[1:-1])
    return (np.digitize(f, edges) + 1).astype(np.int16)


def _rotation(rng: np.random.Generator, max_deg: float) -> np.ndarray:
    a, b, c = np.radians(rng.uniform(-max_deg, max_deg, 3))
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


def warp(lab: np.ndarray, sp: np.ndarray, rng: np.random.Generator, r: RandomiseRanges) -> tuple[np.ndarray, dict]:
    """The label map under a random affine (about the grid centre, in mm) and elastic field."""
    shape = np.asarray(lab.shape)
    m = _rotation(rng, r.rotate_deg) @ np.diag(rng.uniform(*r.scale, 3))
    m = m + rng.uniform(-r.shear, r.shear, (3, 3)) * (1 - np.eye(3))
    grid = np.indices(lab.shape, dtype=np.float32).reshape(3, -1).T
    centre = (shape - 1) / 2.0
    mm = (grid - centre) * sp
    src = mm @ np.linalg.inv(m).T  # output point -> where it comes from (pull-back)
    step = max(1, int(round(r.elastic_smooth_mm / 2 / float(sp.min()))))
    coarse = [max(2, int(np.ceil(n / step)) + 1) for n in lab.shape]
    disp = np.stack([ndi.zoom(ndi.gaussian_filter(rng.standard_normal(coarse), 1.0), np.asarray(lab.shape) / coarse,
                              order=1)[tuple(slice(0, n) for n in lab.shape)] for _ in range(3)], axis=-1)
    disp *= r.elastic_mm / max(float(disp.std()), 1e-6)
    src = src + disp.reshape(-1, 3)
    out = ndi.map_coordinates(lab, (src / sp + centre).T, order=0, mode="constant", cval=0)
    return out.reshape(lab.shape).astype(np.int16), {"affine_mm": m.tolist(), "elastic_sd_mm": r.elastic_mm}


def gmm(lab: np.ndarray, rng: np.random.Generator, r: RandomiseRanges, n_values: int | None = None,
        same_contrast: tuple[tuple[int, ...], ...] = (), same_contrast_p: float = 0.5
        ) -> tuple[np.ndarray, dict[int, tuple]]:
    """One random Gaussian per label value: mean ~ U(r.mean), SD ~ U(r.std). With ``n_values``
    every value below it is drawn, present or not, so maps with the same count share draws.
    Each group of ``same_contrast`` (one tissue under several labels: the blood of the heart's
    chambers and vessels) takes its first label's draw with probability ``same_contrast_p``,
    as on a scan, and keeps a draw per label otherwise (SynthSeg's generation classes, drawn
    per image)."""
    values = np.unique(lab) if n_values is None else np.arange(max(n_values, int(lab.max()) + 1))
    draws = {int(v): (float(rng.uniform(*r.mean)), float(rng.uniform(*r.std))) for v in values}
    for group in same_contrast:
        if rng.uniform() < same_contrast_p and group[0] in draws:
            draws.update({v: draws[group[0]] for v in group[1:] if v in draws})
    lut_m = np.zeros(int(values.max()) + 1, np.float32)
    lut_s = np.zeros_like(lut_m)
    for v, (mu, sd) in draws.items():
        lut_m[v], lut_s[v] = mu, sd
    img = lut_m[lab] + lut_s[lab] * rng.standard_normal(lab.shape).astype(np.float32)
    return img.astype(np.float32), draws


def acquire(img: np.ndarray, sp: np.ndarray, rng: np.random.Generator, r: RandomiseRanges) -> tuple[np.ndarray, dict]:
    """Partial voluming at a random acquired resolution: blur each axis by its acquired
    profile (in-plane: the voxel; slice axis: the slice thickness, FWHM), sample at the
    acquired spacing (thickness + gap on the slice axis), and interpolate back."""
    axis = int(rng.integers(3))
    inplane = float(rng.uniform(*r.inplane_mm))
    thick = float(rng.uniform(*r.thickness_mm))
    gap = float(rng.uniform(*r.gap_mm))
    acq = np.full(3, inplane)
    acq[axis] = thick + gap
    fwhm = np.full(3, inplane)
    fwhm[axis] = thick
    fwhm = np.maximum(fwhm, sp)  # never finer than the label grid
    sigma = np.sqrt(np.maximum(fwhm ** 2 - sp ** 2, 0.0)) / (2.355 * sp)
    blurred = ndi.gaussian_filter(img, sigma)
    factor = np.minimum(sp / np.maximum(acq, sp), 1.0)  # < 1: fewer samples than the label grid
    low = ndi.zoom(blurred, factor, order=1)
    back = ndi.zoom(low, np.asarray(img.shape) / np.asarray(low.shape), order=1)
    return back[tuple(slice(0, n) for n in img.shape)].astype(np.float32), {
        "slice_axis": axis, "inplane_mm": inplane, "thickness_mm": thick, "gap_mm": gap}


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(2 ** 31 - 1))


def scanner(img: np.ndarray, rng: np.random.Generator, r: RandomiseRanges) -> tuple[np.ndarray, dict]:
    """Bias field, Rician noise and gamma (MONAI's random transforms, seeded from ``rng``)."""
    from monai.transforms import RandAdjustContrast, RandBiasField, RandRicianNoise

    x = img[None]
    b = float(rng.uniform(0.0, r.bias))
    bias = RandBiasField(degree=3, coeff_range=(-b, b), prob=1.0)
    bias.set_random_state(seed=_seed(rng))
    x = np.asarray(bias(x))
    x = (x - x.min()) / max(float(np.ptp(x)), 1e-6)
    sigma = float(rng.uniform(*r.noise))
    noise = RandRicianNoise(prob=1.0, std=sigma, sample_std=False)
    noise.set_random_state(seed=_seed(rng))
    x = np.asarray(noise(x))
    g = float(rng.uniform(*r.gamma))
    x = np.asarray(RandAdjustContrast(prob=1.0, gamma=(g, g))(x))
    x = (x - x.min()) / max(float(np.ptp(x)), 1e-6)
    return x[0].astype(np.float32), {"bias_coeff": b, "noise_sigma": sigma, "gamma": g}


def reorient(img: np.ndarray, lab: np.ndarray, affine: np.ndarray, rng: np.random.Generator,
             r: RandomiseRanges) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Random axis flips, a random axis permutation and a random field of view, on image and
    labels alike; the affine follows, so every kept voxel keeps its world position."""
    a = np.asarray(affine, np.float64).copy()
    flips = [int(ax) for ax in range(3) if rng.random() < r.flip]
    for ax in flips:
        img, lab = np.flip(img, ax), np.flip(lab, ax)
        f = np.eye(4)
        f[ax, ax], f[ax, 3] = -1.0, img.shape[ax] - 1
        a = a @ f
    perm = [int(p) for p in (rng.permutation(3) if rng.random() < r.permute else np.arange(3))]
    img, lab = np.transpose(img, perm), np.transpose(lab, perm)
    a = a @ np.eye(4)[:, perm + [3]]
    keep = [max(8, int(round(n * rng.uniform(*r.fov)))) for n in img.shape]
    start = [int(rng.integers(0, n - k + 1)) for n, k in zip(img.shape, keep)]
    sl = tuple(slice(s, s + k) for s, k in zip(start, keep))
    a[:3, 3] = a[:3, :3] @ np.asarray(start, np.float64) + a[:3, 3]
    return (np.ascontiguousarray(img[sl]), np.ascontiguousarray(lab[sl]), a,
            {"flips": flips, "permutation": perm, "crop_start": start, "crop_shape": keep})


def synthesise(labels: np.ndarray, affine: np.ndarray, rng: np.random.Generator,
               ranges: RandomiseRanges = RANGES, clutter_background: bool = True,
               n_labels: int | None = None, same_contrast: tuple[tuple[int, ...], ...] = (),
               same_contrast_p: float = 0.5) -> Synth:
    """One random image and its label map from a label map (module docstring, steps 1-6).

    Args:
        labels: integer label map (3-D); 0 is background.
        affine: its voxel-to-world matrix (spacings are read from it).
        rng: every draw comes from it.
        ranges: the randomisation ranges.
        clutter_background: split the background into random regions of their own contrast.
        n_labels: the label values are 0..n_labels-1, whether present in this map or not: the
            frames of one cine, drawn with the same seed, then get the same contrast per label
            even when a structure is missing from some frames (None: the values present).
        same_contrast: label groups that are one tissue (:func:`gmm`); each shares one draw
            with probability ``same_contrast_p`` (default: every label its own draw).

    Returns:
        Synth with the image in [0, 1], the labels (targets only: clutter is 0), the affine
        of the returned grid and every draw in ``params``.

    >>> import numpy as np
    >>> lab = np.zeros((24, 24, 16), np.int16); lab[6:18, 6:18, 4:12] = 1
    >>> s = synthesise(lab, np.diag([2.0, 2.0, 3.0, 1.0]), np.random.default_rng(0))
    >>> s.image.shape == s.labels.shape and 0.0 <= float(s.image.min()) < float(s.image.max()) <= 1.0
    True
    """
    lab = np.asarray(labels).astype(np.int16)
    if lab.ndim != 3:
        raise ToolError(ErrorCode.shape, f"labels must be 3-D, got shape {lab.shape}",
                        hint="give one 3-D label map (X, Y, Z)", arg="labels")
    sp = np.asarray(affine_spacing(affine), np.float64)
    top = int(lab.max()) + 1 if n_labels is None else max(int(n_labels), int(lab.max()) + 1)
    full = lab.copy()
    params: dict[str, Any] = {}
    if clutter_background:
        n = int(rng.integers(ranges.clutter_classes[0], ranges.clutter_classes[1] + 1))
        bg = clutter(lab.shape, rng, n, smooth_vox=float(rng.uniform(3.0, 8.0)))
        full = np.where(lab == 0, top + bg - 1, lab).astype(np.int16)
        full[(bg == 1) & (lab == 0)] = 0  # one clutter class stays true background (air)
        params["clutter_classes"] = n
    full, params["warp"] = warp(full, sp, rng, ranges)
    target = np.where(full < top, full, 0).astype(np.int16)
    img, draws = gmm(full, rng, ranges, None if n_labels is None else top + params.get("clutter_classes", 0),
                     same_contrast, same_contrast_p)
    params["gmm"] = {str(k): v for k, v in draws.items()}
    img, params["acquisition"] = acquire(img, sp, rng, ranges)
    img, params["scanner"] = scanner(img, rng, ranges)
    img, target, aff, params["geometry"] = reorient(img, target, affine, rng, ranges)
    return Synth(img, target, aff, params)


# ---- label sources -----------------------------------------------------------------------
def cardiac_labels(seed: int) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """One frame (ED or ES) of a randomised-family cardiac phantom of a random ACDC group."""
    from .cardiac import make_cardiac

    rng = np.random.default_rng([seed, 1])
    ph = make_cardiac(f"dr{seed}", seed, size="small", family="randomised",
                      group=str(rng.choice(["NOR", "DCM", "HCM", "MINF", "RV"])))
    seg = ph.labels["seg"]
    frame = int(rng.integers(np.asarray(seg.data).shape[3]))
    return np.asarray(seg.data)[..., frame].astype(np.int16), np.asarray(seg.affine), dict(seg.labels)


def prostate_labels(seed: int) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """Zones (1 PZ, 2 TZ) of a randomised-family prostate phantom with 0-2 lesions (3)."""
    from .prostate import make_prostate

    rng = np.random.default_rng([seed, 2])
    ph = make_prostate(f"dr{seed}", seed, size="small", family="randomised", n_lesions=int(rng.integers(0, 3)))
    zones, les = np.asarray(ph.labels["zones"].data), np.asarray(ph.labels["lesions"].data)
    return (np.where(les > 0, 3, zones).astype(np.int16), np.asarray(ph.labels["zones"].affine),
            {1: "PZ", 2: "TZ", 3: "lesion"})


def brain_labels(seed: int) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """Brain (5) with BraTS tumour labels (1, 2, 4) of a randomised-family phantom; in one
    case of three a second tumour in the other hemisphere (multifocal)."""
    from .brain import make_brain

    rng = np.random.default_rng([seed, 3])
    side, grade = str(rng.choice(["left", "right"])), str(rng.choice(["HGG", "LGG"]))
    ph = make_brain(f"dr{seed}", seed, size="small", family="randomised", grade=grade, side=side)
    seg = np.asarray(ph.labels["seg"].data)
    if rng.random() < 1 / 3:
        other = make_brain(f"dr{seed}b", seed, size="small", family="randomised", grade=grade,
                           side="left" if side == "right" else "right")
        seg = np.where(np.asarray(other.labels["seg"].data) > 0, other.labels["seg"].data, seg)
    lab = np.where(seg > 0, seg, 5 * (np.asarray(ph.labels["brain"].data) > 0)).astype(np.int16)
    return lab, np.asarray(ph.labels["seg"].affine), {1: "necrotic_core", 2: "oedema", 4: "enhancing", 5: "brain"}


SOURCES: dict[str, Callable[[int], tuple[np.ndarray, np.ndarray, dict[int, str]]]] = {
    "cardiac": cardiac_labels, "prostate": prostate_labels, "brain": brain_labels}


__all__ = ["RANGES", "SOURCES", "RandomiseRanges", "Synth", "acquire", "brain_labels", "cardiac_labels", "clutter",
           "gmm", "prostate_labels", "reorient", "scanner", "synthesise", "warp"]
