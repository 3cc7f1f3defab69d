"""Prostate phantoms (fastMRI-prostate / PI-CAI-like): axial T2w, ADC and high-b DWI.

Anatomy is analytic in world space (RAS+ mm), centred on the gland: an irregular ellipsoid
gland whose transition zone (TZ) is a smaller ellipsoid shifted anteriorly, the rest being
the peripheral zone (PZ, a posterior/lateral shell); around it peri-prostatic fat, the
obturator internus muscles, the pubic symphysis, the rectum (wall + air) behind it and
(optionally) the bladder above it. Every sequence is the analytic anatomy evaluated at its
own voxel centres, so labels on every grid are exact (no interpolation).

Sequences (``size="full"`` / ``"small"``):
- ``T2w``: axial, 0.5x0.5x3.0 mm (320x304x24) / 1.5x1.5x3.6 mm (88x80x20), oblique and
  flipped axes when ``oblique`` (else the usual DICOM axial LPS orientation).
- ``ADC`` (units of 1e-6 mm^2/s) and ``DWI`` (b = 1400 s/mm^2, ``S0 * exp(-b * ADC)``) on
  their own coarser grid: 2x2x3 mm (84x80x24) / 2.5x2.5x3.6 mm (52x48x20).

Misalignment (``misalign=True``): the diffusion series see the anatomy moved by a rigid
world->world matrix ``M`` (``bcer.datasets.degrade.rigid_matrix``, rotation about the gland
centre): tissue at T2w world point ``p`` appears in ADC/DWI at world point ``M @ p``.
``truth["misalignment"]["matrix"]`` is ``M``: the fixed(T2w)->moving(ADC) transform in
ITK/``Transform`` direction, the one ``register.rigid(fixed=T2w, moving=ADC)`` should recover;
``matrix_adc_to_t2w`` is its inverse.

Lesions (0-2): T2-dark, DWI-bright, low ADC, irregular blobs inside the gland. For each:
``side`` is the sign of the lesion-mask centroid's RAS x (x > 0 -> "R"), ``zone`` the zone
holding most of its voxels, ``size_mm`` its largest 3-D diameter (the largest distance
between two lesion voxel centres on the T2w grid), ``adc`` its tissue ADC, ``t2_ratio`` its
T2w signal divided by the normal T2w signal of its zone, boxes in voxels (inclusive min,
exclusive max, T2w and ADC grids) and in world mm (the RAS axis-aligned box of its T2w
voxel centres). Sizes never fall in 12.5-17.5 mm, ADC never in 850 +- 50 and T2 ratios
never in 0.6 +- 0.1, so a measured value near the truth cannot cross a threshold.

PI-RADS category (simplified v2.1, the exact rule ``pirads_category`` applies):
- PZ (DWI/ADC dominant): ADC < 850 (markedly restricted) -> 5 if size >= 15 mm else 4;
  otherwise (850 <= ADC < 1000, mildly/moderately restricted) -> 3.
- TZ (T2 dominant): t2_ratio < 0.6 (homogeneous, moderately/markedly hypointense) ->
  5 if size >= 15 mm else 4; otherwise 3, upgraded to 4 when DWI would score 5
  (ADC < 850 and size >= 15 mm).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
from scipy import ndimage
from scipy.spatial import ConvexHull, QhullError
from scipy.spatial.distance import pdist
from scipy.spatial.transform import Rotation

from ..contracts.artifacts import Image, Mask
from ..contracts.errors import ErrorCode, ToolError
from .degrade import rician_noise, rigid_matrix
from .geometry import make_affine, random_direction, world_coords
from .phantom import Phantom, Size, swapped

log = logging.getLogger(__name__)

__all__ = ["make_prostate", "pirads_category", "PIRADS_RULE", "TISSUES", "B_VALUE", "GRIDS", "FAMILIES",
           "family_ranges"]

B_VALUE = 1400.0  # s/mm^2
ADC_MARKED = 850.0  # 1e-6 mm^2/s: below this, DWI/ADC is "markedly" restricted
T2_MARKED = 0.6  # lesion/zone T2w ratio below this is "moderately/markedly hypointense"
SIZE_LARGE_MM = 15.0
PIRADS_RULE = ("PZ: ADC<850 -> (size>=15mm ? 5 : 4), else 3. TZ: T2 ratio<0.6 -> (size>=15mm ? 5 : 4), "
               "else 3, upgraded to 4 if ADC<850 and size>=15mm. ADC in 1e-6 mm2/s; size = largest 3-D "
               "diameter; T2 ratio = lesion T2w / normal T2w of its zone.")

# Tissue classes: name -> (T2w, ADC in 1e-6 mm^2/s, DWI S0); PZ/TZ values are jittered per case.
TISSUES: dict[str, tuple[float, float, float]] = {
    "air": (0.0, 0.0, 0.0), "fat": (750.0, 350.0, 60.0), "muscle": (220.0, 1400.0, 600.0),
    "bone": (300.0, 400.0, 80.0), "rectal_wall": (300.0, 1200.0, 700.0), "lumen": (40.0, 0.0, 0.0),
    "bladder": (1400.0, 2900.0, 1500.0), "PZ": (920.0, 1650.0, 1000.0), "TZ": (540.0, 1200.0, 800.0),
}
_CLASS = {name: i for i, name in enumerate(TISSUES)}
ZONE_LABELS = {1: "PZ", 2: "TZ"}

# ---------------------------------------------------------------------------------------------
# Phantom families (one table). "base" is today's phantom (the fixed values in the code below,
# listed here for reference). "randomised" is domain-randomised and the ONLY family anything is
# tuned or trained on. "heldout" draws DIFFERENT ranges and anatomy variants (larger, lobulated
# BPH-like glands with TZ nodules and calcifications, stronger obliquity, other intensity
# conventions, a receive-coil bias, higher b-values, other lesion sizes/ADC) and is used only
# to measure: never tune a threshold, a network or a default on it, and do not look at its
# numbers while tuning (tune on "randomised"; run "heldout" at the end and report it as is).
# ---------------------------------------------------------------------------------------------
FAMILIES: dict[str, dict[str, Any]] = {
    "base": {
        "gland_semi_mm": ((20, 25), (14, 18), (16, 21)), "oblique_deg": (3, 10), "gland_offset_mm": (0, 7),
        "noise": (0.02, 0.02), "t2_scale": (1.0, 1.0), "b_values": (1400,), "p_identity": 0.0,
        "lesion_diam_mm": "7-12 or 19-24", "note": "fixed code path; values kept clear of PI-RADS thresholds",
    },
    "randomised": {
        # anatomy
        "gland_semi_mm": ((17, 26), (12, 19), (14, 22)), "gland_ripple": (0.03, 0.08), "gland_tilt_deg": 12.0,
        "tz_scale": (0.6, 0.74), "p_capsule": 0.5, "capsule_mm": (1.0, 2.0),
        "rectum_semi_mm": ((11, 17), (8, 13)), "gas_fraction": (0.0, 0.6),
        "p_bladder": 0.8, "bladder_gap_mm": (-2, 14), "p_vesicles": 0.6,
        "tz_nodules": (0, 3), "calcifications": (0, 2),  # BPH nodules and calcifications occur in older men
        # tissue contrast (T2w relative to fat; ADC in 1e-6 mm2/s)
        "tissue_jitter": 0.15, "fat_t2": (650, 850), "pz_fat_ratio": (0.95, 1.4), "tz_fat_ratio": (0.5, 0.8),
        # zone ADCs overlap (PZ ADC falls with age and inflammation; BPH TZ varies)
        "pz_adc": (1300, 1900), "tz_adc": (950, 1400),
        # scanner geometry, per series
        "gland_offset_mm": (0, 25), "gland_offset_si_mm": 8.0, "oblique_deg": (0, 20),
        "adc_center_offset_mm": (0, 15), "fov_scale": (0.95, 1.25), "spacing_scale": (0.9, 1.1),
        "slice_scale": (0.85, 1.1), "extra_slices": (-2, 3),
        # intensity conventions and degradations
        "t2_scale": (0.4, 2.5), "dwi_scale": (0.4, 2.5), "p_adc_integer": 0.3,
        "noise": (0.01, 0.05), "adc_noise_factor": (1.0, 2.5), "bias": (0.0, 0.3), "bias_kind": ("poly", "coil"),
        "b_values": (1400, 1500, 1600, 2000),  # PI-RADS v2.1: b >= 1400, often computed b2000
        # ADC->T2w motion between the series (a share of cases has none)
        "p_identity": 0.3, "misalign_rot_deg": 5.0, "misalign_trans_mm": 5.0,
        # lesions: continuous ranges (values near every PI-RADS threshold occur)
        "lesion_diam_mm": (5, 25), "lesion_ripple": 0.1, "pz_lesion_adc": (450, 1100),
        "tz_lesion_adc": (450, 1000), "lesion_t2_ratio": (0.3, 0.85), "p_pz": 0.6,
        "series": {"T2w": "AX_T2", "ADC": "AX_DIFFUSION_ADC", "DWI": "AX_DIFFUSION_CALC_BVAL"},
    },
    "heldout": {
        "gland_semi_mm": ((21, 30), (15, 22), (17, 25)), "gland_ripple": (0.07, 0.12), "gland_tilt_deg": 20.0,
        "tz_scale": (0.68, 0.8), "p_capsule": 0.8, "capsule_mm": (1.0, 2.5),
        "rectum_semi_mm": ((13, 20), (9, 15)), "gas_fraction": (0.2, 0.8),
        "p_bladder": 0.9, "bladder_gap_mm": (-6, 6), "p_vesicles": 0.9,
        "tz_nodules": (1, 4), "calcifications": (0, 3),
        "tissue_jitter": 0.2, "fat_t2": (800, 1100), "pz_fat_ratio": (0.98, 1.25), "tz_fat_ratio": (0.45, 0.7),
        "pz_adc": (1350, 1800), "tz_adc": (1000, 1400),
        "gland_offset_mm": (10, 35), "gland_offset_si_mm": 10.0, "oblique_deg": (15, 28),
        "adc_center_offset_mm": (10, 25), "fov_scale": (1.1, 1.4), "spacing_scale": (1.0, 1.15),
        "slice_scale": (0.85, 1.0), "extra_slices": (2, 6),
        "t2_scale": (3.0, 12.0), "dwi_scale": (0.1, 0.4), "p_adc_integer": 1.0,
        "noise": (0.02, 0.05), "adc_noise_factor": (1.5, 2.5), "bias": (0.15, 0.35), "bias_kind": "coil",
        "b_values": (1600, 2000),
        "p_identity": 0.35, "misalign_rot_deg": 6.0, "misalign_trans_mm": 6.0,
        "lesion_diam_mm": (7, 26), "lesion_ripple": 0.12, "pz_lesion_adc": (450, 1050),
        "tz_lesion_adc": (450, 950), "lesion_t2_ratio": (0.3, 0.8), "p_pz": 0.65,
        "series": {"T2w": "t2_tse_tra_p2", "ADC": "ADC_map", "DWI": "calc_bval"},
    },
}
LESION_ADC_MAX_FRACTION = 0.82  # a family lesion's ADC stays below this x its zone's normal ADC (visible)
BORDERLINE_KINDS = ("adc", "size", "t2", "small")

# size -> {grid: (spacing mm, shape)}
GRIDS: dict[str, dict[str, tuple[tuple[float, float, float], tuple[int, int, int]]]] = {
    "small": {"T2w": ((1.5, 1.5, 3.6), (88, 80, 20)), "ADC": ((2.5, 2.5, 3.6), (52, 48, 20))},
    "full": {"T2w": ((0.5, 0.5, 3.0), (320, 304, 24)), "ADC": ((2.0, 2.0, 3.0), (84, 80, 24))},
}


@contextmanager
def family_ranges(family: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """Replace some of a family's ranges in ``FAMILIES`` while the block runs (a stress test's
    pinned nuisance, e.g. ``tz_scale=(0.8, 0.8)`` for a thin PZ); restored afterwards, even on
    error.

    A pinned range ``(v, v)`` still consumes its random draw, so case ``k`` keeps everything
    drawn before it and all draws of a fixed count after it (gland, rectum, grids, motion,
    intensities): conditions are paired. Lesion placement is rejection sampling in the zones,
    so where a pinned anatomy changes the zones, lesion positions may differ. Raises
    ``KeyError`` for a field the family does not have (a typo would pin nothing).
    """
    before = FAMILIES[family]
    unknown = sorted(set(fields) - set(before))
    if unknown:
        raise KeyError(f"family {family!r} has no ranges {unknown}")
    with swapped(FAMILIES, family, {**before, **fields}) as ranges:
        yield ranges


def pirads_category(zone: str, size_mm: float, adc: float, t2_ratio: float) -> int:
    """Simplified PI-RADS v2.1 category of one lesion (the rule in the module docstring)."""
    large = size_mm >= SIZE_LARGE_MM
    marked_dwi = adc < ADC_MARKED
    if zone == "PZ":
        return (5 if large else 4) if marked_dwi else 3
    if t2_ratio < T2_MARKED:
        return 5 if large else 4
    return 4 if (marked_dwi and large) else 3


@dataclass
class _Blob:
    """An ellipsoid whose boundary is rippled by a few random cosines of the direction."""

    center: np.ndarray
    semi: np.ndarray
    rot: np.ndarray
    ripple: list[tuple[float, np.ndarray, float]] = field(default_factory=list)

    @classmethod
    def random(cls, rng: np.random.Generator, center, semi, max_tilt_deg: float, ripple: float) -> "_Blob":
        rot = Rotation.from_rotvec(rng.normal(size=3) / np.sqrt(3) * np.deg2rad(max_tilt_deg)).as_matrix()
        waves = [(float(rng.uniform(0.4, 1.0) * ripple), rng.normal(size=3) * 1.6, float(rng.uniform(0, 2 * np.pi)))
                 for _ in range(4)]
        return cls(np.asarray(center, float), np.asarray(semi, float), rot, waves)

    def inside(self, pts: np.ndarray) -> np.ndarray:
        # The exact test costs ~20 passes over the points; a cheap cube test around the
        # blob's largest reach first keeps "full"-size grids fast.
        reach = float(self.semi.max()) * (1.0 + sum(abs(a) for a, _, _ in self.ripple))
        near = np.abs(pts[..., 0] - self.center[0]) < reach
        for ax in (1, 2):
            near &= np.abs(pts[..., ax] - self.center[ax]) < reach
        out = np.zeros(pts.shape[:-1], dtype=bool)
        local = (pts[near] - self.center) @ self.rot / self.semi  # row-vector form of R^T (p - c) / s
        rho = np.linalg.norm(local, axis=-1)
        u = local / np.maximum(rho, 1e-9)[..., None]
        edge = 1.0 + sum(a * np.cos(u @ w + ph) for a, w, ph in self.ripple)
        out[near] = rho < edge
        return out


@dataclass
class _Lesion:
    blob: _Blob
    adc: float
    t2_ratio: float
    zone: str = ""
    kind: str = ""  # "" or the borderline kind ("adc", "size", "t2", "small")


@dataclass
class _Anatomy:
    center: np.ndarray
    gland: _Blob
    tz: _Blob
    rectum: tuple[np.ndarray, float, float, float]  # (centre xy, semi x, semi y, wall mm)
    muscles: list[tuple[float, float, float, float]]  # (x, y, semi x, semi y) columns along z
    symphysis: tuple[np.ndarray, np.ndarray]
    bladder: _Blob | None
    values: dict[str, tuple[float, float, float]]
    lesions: list[_Lesion] = field(default_factory=list)

    def classes(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tissue class index and zone label (0/1 PZ/2 TZ) at world points (..., 3)."""
        x, y, z = pts[..., 0], pts[..., 1], pts[..., 2]
        cls = np.full(pts.shape[:-1], _CLASS["fat"], dtype=np.int8)
        for mx, my, sx, sy in self.muscles:
            cls[((x - mx) / sx) ** 2 + ((y - my) / sy) ** 2 < 1] = _CLASS["muscle"]
        sc, ss = self.symphysis
        cls[((x - sc[0]) / ss[0]) ** 2 + ((y - sc[1]) / ss[1]) ** 2 + ((z - sc[2]) / ss[2]) ** 2 < 1] = _CLASS["bone"]
        (rx, ry), ax, ay, wall = self.rectum
        r_out = ((x - rx) / ax) ** 2 + ((y - ry) / ay) ** 2
        r_in = ((x - rx) / (ax - wall)) ** 2 + ((y - ry) / (ay - wall)) ** 2
        cls[r_out < 1] = _CLASS["rectal_wall"]
        cls[r_in < 1] = _CLASS["lumen"]
        if self.bladder is not None:
            cls[self.bladder.inside(pts)] = _CLASS["bladder"]
        gland = self.gland.inside(pts)
        tz = gland & self.tz.inside(pts)
        cls[gland] = _CLASS["PZ"]
        cls[tz] = _CLASS["TZ"]
        zones = np.where(tz, 2, np.where(gland, 1, 0)).astype(np.int16)
        return cls, zones

    def lesion_labels(self, pts: np.ndarray, zones: np.ndarray) -> np.ndarray:
        """Lesion index (1..n, 0 none) at world points; lesions stay inside the gland."""
        out = np.zeros(pts.shape[:-1], dtype=np.int16)
        for i, les in enumerate(self.lesions, start=1):
            out[les.blob.inside(pts) & (zones > 0) & (out == 0)] = i
        return out

    def images(self, pts: np.ndarray, rng: np.random.Generator, noise: float
               ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """T2w, ADC and DWI arrays at world points, plus the zone and lesion labels there."""
        cls, zones = self.classes(pts)
        lesions = self.lesion_labels(pts, zones)
        table = np.array([self.values[name] for name in TISSUES], dtype=np.float64)
        t2, adc, s0 = (table[cls, c] for c in range(3))
        for i, les in enumerate(self.lesions, start=1):
            m = lesions == i
            zt2, _, zs0 = self.values[les.zone]
            t2[m], adc[m], s0[m] = les.t2_ratio * zt2, les.adc, zs0
        dwi = s0 * np.exp(-B_VALUE * adc * 1e-6)
        out = {"T2w": rician_noise(t2, noise * self.values["PZ"][0], rng),
               "DWI": rician_noise(dwi, noise * 0.5 * self.values["PZ"][2], rng),
               # ADC maps are fitted, not magnitudes: Gaussian error, clipped at 0
               "ADC": np.clip(adc + rng.normal(0.0, noise * 1000.0, adc.shape), 0, None).astype(np.float32)}
        return out, zones, lesions


def _random_anatomy(rng: np.random.Generator, bladder: bool) -> _Anatomy:
    c = rng.uniform(-3, 3, size=3)
    a, b, h = rng.uniform(20, 25), rng.uniform(14, 18), rng.uniform(16, 21)
    gland = _Blob.random(rng, c, (a, b, h), max_tilt_deg=8, ripple=0.05)
    tz_scale = rng.uniform(0.62, 0.74)
    tz = _Blob.random(rng, c + gland.rot @ np.array([0.0, 0.3 * b, 0.1 * h]),
                      (tz_scale * a, (tz_scale - 0.03) * b, (tz_scale + 0.07) * h), max_tilt_deg=5, ripple=0.03)
    rectum = (np.array([c[0] + rng.uniform(-3, 3), c[1] - b - rng.uniform(10, 13)]),
              rng.uniform(11, 14), rng.uniform(9, 11), 3.5)
    mx = a + rng.uniform(16, 22)
    muscles = [(c[0] - mx, c[1], 8.0, 24.0), (c[0] + mx, c[1], 8.0, 24.0)]
    symphysis = (c + np.array([0.0, b + rng.uniform(12, 16), 0.0]), np.array([7.0, 9.0, 22.0]))
    bl = _Blob.random(rng, c + np.array([0.0, 6.0, h + 24.0]), (32, 26, 20), 5, 0.04) if bladder else None
    values = dict(TISSUES)
    values["PZ"] = (rng.uniform(850, 1000), rng.uniform(1550, 1800), 1000.0)
    values["TZ"] = (rng.uniform(480, 600), rng.uniform(1100, 1300), 800.0)
    return _Anatomy(c, gland, tz, rectum, muscles, symphysis, bl, values)


def _lesion_design(rng: np.random.Generator, zone: str) -> tuple[float, float]:
    """(ADC, T2 ratio) away from the rule thresholds (see module docstring)."""
    low_adc = rng.random() < (0.65 if zone == "PZ" else 0.5)
    adc = rng.uniform(560, 780) if low_adc else rng.uniform(910, 990)
    dark = rng.random() < (0.75 if zone == "PZ" else 0.55)
    t2_ratio = rng.uniform(0.35, 0.5) if dark else rng.uniform(0.72, 0.85)
    return float(adc), float(t2_ratio)


def _measure(mask: np.ndarray, pts: np.ndarray) -> tuple[float, np.ndarray]:
    """Largest diameter (mm) and centroid (world) of the voxels of ``mask`` at points ``pts``."""
    p = pts[mask]
    if len(p) < 2:
        return 0.0, p.mean(axis=0) if len(p) else np.zeros(3)
    try:
        hull = p[ConvexHull(p).vertices]
    except QhullError:  # flat or tiny sets (e.g. one slice): no 3-D hull, use every point
        hull = p
    return float(pdist(hull).max()), p.mean(axis=0)


def _touches(blob: np.ndarray, others: np.ndarray) -> bool:
    """True when a new lesion blob overlaps or touches (within 2 voxels) earlier lesions, which
    would merge them into one connected region."""
    return bool(others.any() and (blob & ndimage.binary_dilation(others, iterations=2)).any())


@dataclass
class LesionSpec:
    """How lesions of one case are drawn: diameter, (ADC, T2 ratio) design, boundary ripple, PZ
    share, and which measured sizes are accepted. The base spec keeps values clear of every
    PI-RADS threshold; the family specs draw continuous ranges (values near a threshold occur),
    and ``borderline`` forces one lesion next to a threshold or at the detection limit."""

    diameter: Callable[[np.random.Generator], float]
    design: Callable[[np.random.Generator, str], tuple[float, float]]
    ripple: float = 0.08
    p_pz: float = 0.7
    accept_size: Callable[[float], bool] = lambda size: not (12.5 <= size <= 17.5)
    min_voxels: int = 8
    kind: str = ""


def _base_diameter(rng: np.random.Generator) -> float:
    return float(rng.uniform(19, 24) if rng.random() < 0.35 else rng.uniform(7, 12))


BASE_LESIONS = LesionSpec(_base_diameter, _lesion_design)


def _place_lesions(rng: np.random.Generator, anat: _Anatomy, pts: np.ndarray, n: int,
                   specs: list[LesionSpec] | None = None) -> None:
    """Add ``n`` lesions whose measured side/zone are the intended ones and whose size is
    accepted by their spec; retried with new random designs until they are. When a first,
    large lesion leaves no room for the next one, all are redrawn."""
    specs = specs or [BASE_LESIONS] * n
    _, zones = anat.classes(pts)
    for _ in range(5):
        anat.lesions.clear()
        if all(_place_one(rng, anat, pts, zones, idx, specs[idx]) for idx in range(n)):
            return
    log.warning("could only place %d of %d lesions", len(anat.lesions), n)


def _place_one(rng: np.random.Generator, anat: _Anatomy, pts: np.ndarray, zones: np.ndarray, idx: int,
               spec: LesionSpec = BASE_LESIONS) -> bool:
    for attempt in range(100):
        if attempt % 20 == 0:  # a crowded zone/side: redraw where the lesion should go
            want_zone = "PZ" if rng.random() < spec.p_pz else "TZ"
            want_side = str(rng.choice(["L", "R"]))
            sign = 1.0 if want_side == "R" else -1.0
            cand = pts[(zones == (1 if want_zone == "PZ" else 2)) & (sign * pts[..., 0] > 4.0)]
        if len(cand) == 0:
            continue
        center = cand[rng.integers(len(cand))]
        diam = spec.diameter(rng)
        semi = diam / 2 * np.array([1.0, rng.uniform(0.75, 1.0), rng.uniform(0.75, 1.0)])
        adc, t2r = spec.design(rng, want_zone)
        les = _Lesion(_Blob.random(rng, center, semi, 90, spec.ripple), adc, t2r, want_zone)
        les.kind = spec.kind
        anat.lesions.append(les)
        lab = anat.lesion_labels(pts, zones)
        m = lab == idx + 1
        size, centroid = _measure(m, pts)
        in_zone = np.bincount(zones[m], minlength=3) if m.any() else np.zeros(3)
        if (m.sum() >= spec.min_voxels and spec.accept_size(size) and abs(centroid[0]) > 2.0
                and ("R" if centroid[0] > 0 else "L") == want_side
                and int(np.argmax(in_zone[1:])) + 1 == (1 if want_zone == "PZ" else 2)
                and not _touches(les.blob.inside(pts), (lab > 0) & (lab <= idx))):
            return True
        anat.lesions.pop()
    return False


def _grid(rng: np.random.Generator, name: str, size: Size, oblique: bool, center: np.ndarray):
    sp, shape = GRIDS[size][name]
    if oblique:
        direction = random_direction(rng, oblique_deg=10.0, flips=True)
    else:
        direction = np.diag([-1.0, -1.0, 1.0])  # DICOM axial: rows to patient left, columns posterior
    return make_affine(direction, sp, shape, center + rng.uniform(-4, 4, size=3)), shape


def _box(mask: np.ndarray) -> list[list[int]]:
    idx = np.argwhere(mask)
    return [idx.min(axis=0).tolist(), (idx.max(axis=0) + 1).tolist()]


def _lesion_truth(anat: _Anatomy, t2_pts, t2_lab, t2_zones, t2_img, adc_pts, adc_lab, adc_img,
                  voxel_ml: tuple[float, float]) -> list[dict[str, Any]]:
    out = []
    for i, les in enumerate(anat.lesions, start=1):
        m, ma = t2_lab == i, adc_lab == i
        size, centroid = _measure(m, t2_pts)
        zone = ZONE_LABELS[int(np.argmax(np.bincount(t2_zones[m], minlength=3)[1:])) + 1]
        p = t2_pts[m]
        normal = t2_img[(t2_zones == (1 if zone == "PZ" else 2)) & (t2_lab == 0)]
        rec = {"id": i, "label": i, "zone": zone, "side": "R" if centroid[0] > 0 else "L",
               "size_mm": size, "volume_ml": float(m.sum() * voxel_ml[0]),
               "volume_ml_adc": float(ma.sum() * voxel_ml[1]),
               "adc": les.adc, "t2_ratio": les.t2_ratio,
               "adc_mean": float(adc_img[ma].mean()) if ma.any() else None,
               "t2_ratio_measured": float(t2_img[m].mean() / normal.mean()),
               "centroid_world": centroid.tolist(),
               "centroid_world_adc": adc_pts[ma].mean(axis=0).tolist() if ma.any() else None,
               "box_voxel": _box(m), "box_voxel_adc": _box(ma) if ma.any() else None,
               "box_world": [p.min(axis=0).tolist(), p.max(axis=0).tolist()]}
        rec["category"] = pirads_category(zone, size, les.adc, les.t2_ratio)
        if les.kind:
            rec["borderline"] = les.kind
        out.append(rec)
    return out


def _misalignment(rng: np.random.Generator, misalign: bool, center: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """The rigid T2w->ADC matrix ``M`` (identity unless ``misalign``) and its truth record."""
    rot, trans = (rng.uniform(-5, 5, 3).tolist(), rng.uniform(-5, 5, 3).tolist()) if misalign else ([0.0] * 3,) * 2
    move = rigid_matrix(rot, trans, center)
    return move, {"fixed": "T2w", "moving": ["ADC", "DWI"], "matrix": move.tolist(),
                  "matrix_adc_to_t2w": np.linalg.inv(move).tolist(), "rotation_deg": rot, "translation_mm": trans,
                  "center_world": center.tolist(),
                  "direction": "tissue at T2w world point p appears in ADC/DWI at matrix @ p "
                               "(ITK fixed->moving with fixed=T2w, moving=ADC)"}


def phantom_labels(anat: _Anatomy, t2: Image, adc: Image, zones: np.ndarray, lesions: np.ndarray,
                   zones_adc: np.ndarray, lesions_adc: np.ndarray, t2_pts: np.ndarray, adc_world: np.ndarray
                   ) -> tuple[dict[str, Mask], list[dict[str, Any]]]:
    """A phantom's label masks (zones, gland, lesions on the T2w grid; lesions and gland on the
    ADC grid) and its per-lesion truth, from the rendered label arrays."""
    names = {i: f"lesion_{i}" for i in range(1, len(anat.lesions) + 1)}
    labels = {"zones": Mask(zones, t2.affine, {}, labels=dict(ZONE_LABELS)),
              "gland": Mask((zones > 0).astype(np.int16), t2.affine, {}, labels={1: "gland"}),
              "lesions": Mask(lesions, t2.affine, {}, labels=dict(names)),
              "lesions_adc": Mask(lesions_adc, adc.affine, {}, labels=dict(names)),
              "gland_adc": Mask((zones_adc > 0).astype(np.int16), adc.affine, {}, labels={1: "gland"})}
    voxel_ml = (t2.voxel_volume_ml, adc.voxel_volume_ml)
    return labels, _lesion_truth(anat, t2_pts, lesions, zones, t2.data, adc_world, lesions_adc, adc.data, voxel_ml)


def make_prostate(case_id: str, seed: int, size: Size = "small", n_lesions: int | None = None,
                  misalign: bool = True, oblique: bool = True, noise: float | None = None,
                  bladder: bool | None = None, family: str = "base", borderline: bool = False) -> Phantom:
    """A prostate phantom: T2w, ADC and DWI with zones, lesions and exact ground truth.

    Args:
        case_id: the case's id.
        seed: everything random derives from it (same seed, same phantom).
        size: ``"small"`` (fast, for tests) or ``"full"`` (realistic resolution).
        n_lesions: 0, 1 or 2; random (seeded) when None.
        misalign: move the diffusion series by a known rigid transform (see module docstring);
            in the randomised/held-out families a share of cases (``p_identity``) has none.
        oblique: oblique, flipped grids; otherwise plain DICOM-axial (LPS) grids (base only:
            the families always draw their own obliquity).
        noise: noise std as a fraction of the normal PZ signal (T2w/DWI Rician, ADC Gaussian);
            None: 0.02 (base) or the family's range.
        bladder: draw the bladder; random (base 70 %, families ``p_bladder``) when None.
        family: ``"base"`` (today's phantom), ``"randomised"`` (tuning/training) or
            ``"heldout"`` (measurement only); ranges in ``FAMILIES``.
        borderline: make the first lesion a borderline one (ADC near 850, size near 15 mm,
            TZ T2 ratio near 0.6, or a lesion at the detection limit; ``truth.lesions[i].borderline``
            names the kind), so PI-RADS accuracy is not 1.0 by construction.

    Returns:
        Phantom with sequences ``T2w``, ``ADC``, ``DWI``; labels ``zones`` (1 PZ, 2 TZ),
        ``gland``, ``lesions`` (1..n) on the T2w grid and ``lesions_adc``, ``gland_adc`` on
        the ADC grid; truth as described in the module docstring.

    >>> ph = make_prostate("p001", seed=1, n_lesions=1)
    >>> ph.truth["lesions"][0]["side"] in ("L", "R")
    True
    """
    if size not in GRIDS:
        raise ToolError(ErrorCode.value_range, f"unknown size {size!r}", hint=f"valid: {sorted(GRIDS)}", arg="size")
    if n_lesions is not None and not 0 <= n_lesions <= 2:
        raise ToolError(ErrorCode.value_range, f"n_lesions must be 0, 1 or 2, got {n_lesions}", arg="n_lesions")
    if family not in FAMILIES:
        raise ToolError(ErrorCode.value_range, f"unknown phantom family {family!r}", hint=f"valid: {sorted(FAMILIES)}",
                        arg="family")
    if family != "base":
        from .generators import family_builder

        return family_builder("prostate")(case_id, seed, size, n_lesions, misalign, noise, bladder, family, borderline)
    noise = 0.02 if noise is None else noise
    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 2], p=[0.25, 0.45, 0.30])) if n_lesions is None else int(n_lesions)
    anat = _random_anatomy(rng, bool(rng.random() < 0.7) if bladder is None else bladder)
    t2_aff, t2_shape = _grid(rng, "T2w", size, oblique, anat.center)
    adc_aff, adc_shape = _grid(rng, "ADC", size, oblique, anat.center)
    t2_pts = world_coords(t2_aff, t2_shape)
    specs = [BASE_LESIONS] * n
    if borderline and n:
        specs[0] = _borderline(BASE_LESIONS, str(rng.choice(BORDERLINE_KINDS)))
    _place_lesions(rng, anat, t2_pts, n, specs)
    move, motion = _misalignment(rng, misalign, anat.center)
    t2_imgs, zones, lesions = anat.images(t2_pts, rng, noise)
    # The diffusion scan shows at world point q the tissue that sits at M^-1 q in T2w space.
    adc_world = world_coords(adc_aff, adc_shape)
    adc_pts = adc_world @ np.linalg.inv(move)[:3, :3].T + np.linalg.inv(move)[:3, 3]
    d_imgs, zones_adc, lesions_adc = anat.images(adc_pts, rng, noise)
    t2 = Image(t2_imgs["T2w"], t2_aff, {"sequence": "T2w", "series_description": "AX_T2"})
    adc = Image(d_imgs["ADC"], adc_aff, {"sequence": "ADC", "units": "1e-6 mm2/s",
                                        "series_description": "AX_DIFFUSION_ADC"})
    dwi = Image(d_imgs["DWI"], adc_aff.copy(), {"sequence": "DWI", "b_value": B_VALUE,
                                                 "series_description": "AX_DIFFUSION_CALC_BVAL"})
    labels, lesion_truth = phantom_labels(anat, t2, adc, zones, lesions, zones_adc, lesions_adc, t2_pts, adc_world)
    truth = {"domain": "prostate", "n_lesions": len(lesion_truth), "lesions": lesion_truth,
             "gland_volume_ml": labels["gland"].volume_ml(1),
             "pz_volume_ml": labels["zones"].volume_ml(1), "tz_volume_ml": labels["zones"].volume_ml(2),
             "max_category": max((les["category"] for les in lesion_truth), default=1),
             "misalignment": motion, "adc_units": "1e-6 mm2/s", "b_value": B_VALUE, "pirads_rule": PIRADS_RULE,
             "tissue_values": {k: list(v) for k, v in anat.values.items()}, "has_bladder": anat.bladder is not None}
    metadata = {"age": int(rng.integers(52, 80)), "sex": "M", "psa_ng_ml": round(float(rng.uniform(2, 25)), 1),
                "b_value": B_VALUE, "history": "elevated PSA; rule out clinically significant prostate cancer"}
    return Phantom(case_id, "prostate", {"T2w": t2, "ADC": adc, "DWI": dwi}, labels, metadata, truth)


# ----------------------------------------------------------------------------- borderline lesions

def _borderline(spec: LesionSpec, kind: str) -> LesionSpec:
    """``spec`` with one value drawn next to a PI-RADS threshold or at the detection limit."""
    design = spec.design
    if kind == "adc":  # PZ lesion, ADC within 45 of the 850 threshold
        return LesionSpec(spec.diameter, lambda rng, zone: (float(rng.uniform(805, 895)), design(rng, zone)[1]),
                          spec.ripple, 1.0, spec.accept_size, spec.min_voxels, kind)
    if kind == "t2":  # TZ lesion, T2 ratio within 0.07 of the 0.6 threshold
        return LesionSpec(spec.diameter, lambda rng, zone: (design(rng, zone)[0], float(rng.uniform(0.53, 0.67))),
                          spec.ripple, 0.0, spec.accept_size, spec.min_voxels, kind)
    if kind == "size":  # largest diameter within 2.5 mm of the 15 mm threshold
        return LesionSpec(lambda rng: float(rng.uniform(14.0, 18.5)), design, spec.ripple, spec.p_pz,
                          lambda size: 12.5 <= size <= 17.5, spec.min_voxels, kind)
    if kind == "small":  # 4.5-6.5 mm: about 3-8 voxels of the coarse diffusion grid
        return LesionSpec(lambda rng: float(rng.uniform(4.5, 6.5)), design, spec.ripple, spec.p_pz,
                          lambda size: size < 12.5, 3, kind)
    raise ToolError(ErrorCode.value_range, f"unknown borderline kind {kind!r}", hint=f"valid: {BORDERLINE_KINDS}")
