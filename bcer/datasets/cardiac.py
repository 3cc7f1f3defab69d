"""ACDC-like short-axis cine phantoms with exact ground truth for the five ACDC groups.

Anatomy is analytic in a heart frame placed obliquely in world space (RAS+ mm) and sampled
at the voxel centres of a short-axis stack, one label volume per frame:

- LV blood pool: a superellipsoid tapering towards a fixed apex; the base plane descends
  towards the apex in systole (longitudinal shortening) while the radius shrinks.
- Myocardium: a shell of angle-dependent thickness around the LV; each ring keeps its area
  over the cycle (incompressible muscle), so the wall thickens as the cavity shrinks.
- RV cavity: a tapered ellipse on the septal side minus the LV, i.e. a crescent hugging the
  septum; its free wall is drawn in the image but, as in ACDC, not labelled.
- Static background: body, subcutaneous fat, lungs, descending aorta.

Groups: NOR, DCM (dilated, poor EF), HCM (thick septum, hyperdynamic), MINF (poor EF with an
akinetic, thinned sector over some slices), RV (dilated, poorly contracting RV). Every
number in ``Phantom.truth`` is computed from the sampled label maps (:func:`cardiac_truth`),
never from the analytic shapes, so it is exact for the data.

Families (``family=``; ranges in :data:`FAMILY_RANGES`, one table):

- ``"base"``: the original phantoms, unchanged (same seed, same case).
- ``"randomised"``: domain-randomised acquisition and anatomy for tuning and training: field
  of view and matrix, in-plane rotation, flips and obliquity of the stack, heart position in
  the field of view, slices beyond base and apex, base/apex slice order, trigger delay (ED
  anywhere in the cine, at a fractional frame), frame count, volume-curve shape, wall
  thickness, tissue contrast (bSSFP towards gradient echo), global intensity scale, noise,
  coil shading (bias), point spread and through-plane partial volume, and in some cases a
  liver and a thin pericardial fat layer.
- ``"heldout"``: other ranges and anatomy variants (larger fields of view with the heart
  further off centre, coarser pixels, thinner slices, more frames, a physiological volume
  curve with isovolumic relaxation, diastasis and atrial kick, a thicker pericardial fat
  layer and a liver in every case, gradient-echo contrast, stronger noise and shading,
  through-plane partial volume). A left atrium above the mitral plane can be drawn (``atrium``, a probability),
  but neither family draws one: the classical segmentation takes it for LV (a stress test
  in ``benchmarks/cardiac_families.py --atrium``).
  **Rule: nothing is ever tuned or trained on the held-out family** (thresholds,
  networks, defaults); it only measures. Its ranges may change only to make it more unlike
  the randomised family, never to make a tool pass.

``borderline=True`` draws EF, LV/RV volumes near the ACDC group thresholds (the case still
meets exactly its own group's criteria on the measured truth), so classifying it needs
accurate measurements and group accuracy is not 1.0 by construction.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator

import numpy as np
from scipy import ndimage

from ..contracts.artifacts import Cine, Mask
from ..contracts.errors import ErrorCode, ToolError
from .degrade import bias_field, rician_noise
from .geometry import make_affine, random_direction, world_coords
from .phantom import Phantom, Size, swapped

log = logging.getLogger(__name__)

GROUPS = ("NOR", "DCM", "HCM", "MINF", "RV")
LABELS = {1: "RV", 2: "MYO", 3: "LV"}
MYO_DENSITY_G_ML = 1.05
# bSSFP-like relative intensities: blood bright, myocardium dark, fat bright, lung black.
INTENSITY = {"outside": 0.0, "body": 0.32, "fat": 0.85, "lung": 0.04, "aorta": 0.92,
             "rv_wall": 0.26, "myo": 0.22, "lv": 0.95, "rv": 0.9}


@dataclass(frozen=True)
class _Group:
    lv_edvi: tuple[float, float]   # target LV EDV / BSA, mL/m2 (design value; truth is measured)
    lv_ef: tuple[float, float]     # target LVEF, %
    wall: tuple[float, float]      # ED wall thickness away from the septum, mm
    septal_extra: tuple[float, float]  # extra ED septal thickness, mm
    rv_scale: tuple[float, float]  # RV size relative to a normal RV
    rv_ef: tuple[float, float]     # target RVEF, %
    akinesia: bool = False


_GROUP_PARAMS = {
    "NOR": _Group((68, 82), (57, 62), (7.5, 9.0), (0.0, 0.5), (0.95, 1.05), (55, 62)),
    "DCM": _Group((130, 160), (22, 32), (6.0, 7.5), (0.0, 0.5), (0.95, 1.05), (45, 55)),
    "HCM": _Group((62, 76), (68, 76), (11.0, 13.0), (8.0, 11.0), (0.9, 1.0), (55, 62)),
    "MINF": _Group((80, 92), (30, 36), (8.0, 9.0), (0.0, 0.5), (0.95, 1.05), (45, 55), True),
    "RV": _Group((68, 82), (56, 62), (7.5, 9.0), (0.0, 0.5), (1.2, 1.3), (22, 32)),
}


# ---- phantom families: every range of the randomised and held-out families, in one table ----
FAMILIES = ("base", "randomised", "heldout")


@dataclass(frozen=True)
class FamilyRanges:
    """Parameter ranges of one phantom family (uniform draws unless said otherwise)."""

    spacing_mm: dict[str, tuple[float, float]]  # in-plane voxel size, per size
    slice_mm: dict[str, tuple[float, float]]    # slice spacing, per size
    frames: dict[str, tuple[int, int]]          # frames per cycle (inclusive), per size
    fov_mm: tuple[float, float]                 # field of view along array axis 0
    aspect: tuple[float, float]                 # matrix Y / X
    oblique_deg: tuple[float, float]            # planned stack vs true long axis
    axis_jitter: float                          # std of the long-axis direction components
    heart_offset_mm: tuple[float, float]        # in-plane heart distance from the FOV centre
    extra_slices: tuple[int, int]               # slices beyond the base and the apex (each end)
    apex_first: float                           # probability that slice 0 is apical
    flip: float                                 # probability of flipping each in-plane axis
    intensity_scale: tuple[float, float]        # global scale, log-uniform (scanner units)
    contrast_mix: tuple[float, float]           # tissue levels: 0 = bSSFP, 1 = gradient echo (mixed)
    contrast_jitter: float                      # relative jitter of each tissue level
    blur_vox: tuple[float, float]               # in-plane point-spread sigma (voxels)
    noise: tuple[float, float]                  # Rician sigma / blood level
    bias: tuple[float, float]                   # peak |log| of the coil shading
    es_phase: tuple[float, float]               # ES time / RR
    curves: tuple[str, ...]                     # volume-curve models drawn from
    atrium: float                               # probability of a left atrium above the base
    #   (0 in both families: seg.cardiac's classical path takes it for LV; a stress option)
    liver: float                                # probability of a liver under the heart
    fat: float                                  # probability of pericardial fat
    pericardial_fat_mm: tuple[float, float]     # thickness of that fat layer around the epicardium
    slice_profile: float                        # probability of through-plane partial volume
    wall_scale: tuple[float, float]             # scale of every ED wall thickness
    height_cm: tuple[float, float]
    weight_kg: tuple[float, float]


FAMILY_RANGES: dict[str, FamilyRanges] = {
    "randomised": FamilyRanges(
        spacing_mm={"small": (2.4, 3.4), "full": (1.1, 1.8)},
        slice_mm={"small": (9.0, 13.0), "full": (7.0, 10.0)},
        frames={"small": (9, 20), "full": (16, 30)},
        fov_mm=(170.0, 340.0), aspect=(0.75, 1.0), oblique_deg=(0.0, 15.0), axis_jitter=0.12,
        heart_offset_mm=(0.0, 45.0), extra_slices=(0, 1), apex_first=0.5, flip=0.5,
        intensity_scale=(0.5, 2000.0), contrast_mix=(0.0, 1.0), contrast_jitter=0.12, blur_vox=(0.4, 0.9),
        noise=(0.01, 0.06), bias=(0.0, 0.4), es_phase=(0.3, 0.4), curves=("cosine", "skewed"),
        atrium=0.5, liver=0.5, fat=0.5, pericardial_fat_mm=(0.5, 3.5), slice_profile=0.5,
        wall_scale=(0.9, 1.1), height_cm=(155.0, 192.0), weight_kg=(52.0, 105.0)),
    "heldout": FamilyRanges(
        spacing_mm={"small": (3.3, 3.9), "full": (1.7, 2.1)},
        slice_mm={"small": (7.5, 9.0), "full": (6.0, 7.0)},
        frames={"small": (21, 28), "full": (30, 36)},
        fov_mm=(300.0, 380.0), aspect=(0.65, 0.8), oblique_deg=(15.0, 25.0), axis_jitter=0.15,
        heart_offset_mm=(30.0, 60.0), extra_slices=(1, 2), apex_first=0.5, flip=0.5,
        intensity_scale=(3000.0, 30000.0), contrast_mix=(0.95, 1.05), contrast_jitter=0.08, blur_vox=(0.7, 1.0),
        noise=(0.04, 0.07), bias=(0.3, 0.45), es_phase=(0.26, 0.44), curves=("physiological",),
        atrium=0.0, liver=1.0, fat=1.0, pericardial_fat_mm=(2.0, 4.0), slice_profile=1.0,
        wall_scale=(0.85, 1.15), height_cm=(148.0, 200.0), weight_kg=(45.0, 125.0)),
}
# Gradient-echo-like levels (held-out contrast): less blood-myocardium contrast than bSSFP.
INTENSITY_GRE = {"outside": 0.0, "body": 0.42, "fat": 0.9, "lung": 0.06, "aorta": 0.8, "rv_wall": 0.36,
                 "myo": 0.3, "lv": 0.78, "rv": 0.74, "la": 0.76, "liver": 0.5}
# Borderline draws: per group, variants of (design ranges overriding the group's, the measured
# value that must land near its ACDC threshold). Designs are offset from the target because
# the measured value differs from the design (ES between frames, akinesia, voxel counts).
_BORDERLINE: dict[str, list[tuple[dict[str, tuple[float, float]], tuple[str, float]]]] = {
    "NOR": [({"rv_ef": (42.0, 46.0)}, ("rv_ef_pct", 40.0)), ({"rv_scale": (1.06, 1.1)}, ("rv_edvi_ml_m2", 110.0))],
    "DCM": [({"lv_ef": (38.5, 43.5)}, ("lv_ef_pct", 40.0)), ({"lv_edvi": (101.0, 107.0)}, ("lv_edvi_ml_m2", 100.0))],
    "HCM": [({"lv_ef": (52.5, 56.0)}, ("lv_ef_pct", 55.0))],
    "MINF": [({"lv_ef": (45.0, 51.0)}, ("lv_ef_pct", 40.0))],
    "RV": [({"rv_ef": (38.0, 42.5), "rv_scale": (0.95, 1.05)}, ("rv_ef_pct", 40.0)),
           ({"rv_scale": (1.12, 1.18), "rv_ef": (50.0, 58.0)}, ("rv_edvi_ml_m2", 110.0))],
}
# a borderline case's measured value must lie within this distance of its threshold
_BORDER_BAND = {"lv_ef_pct": 4.0, "lv_edvi_ml_m2": 8.0, "rv_ef_pct": 4.0, "rv_edvi_ml_m2": 10.0}


@contextmanager
def family_ranges(family: str, **fields: Any) -> Iterator[FamilyRanges]:
    """Replace some of a family's ranges while the block runs (a stress test's pinned nuisance,
    a training distribution wider than the family's); restored afterwards, even on error.

    A pinned range ``(v, v)`` still consumes its random draw, so case ``k`` keeps its heart,
    group and other nuisances: conditions are paired. Raises ``TypeError`` for a field
    ``FamilyRanges`` does not have.
    """
    with swapped(FAMILY_RANGES, family, replace(FAMILY_RANGES[family], **fields)) as ranges:
        yield ranges


def borderline_ok(truth: dict[str, Any], group: str, target: tuple[str, float] | None) -> bool:
    """The measured truth meets exactly its own group's ACDC criteria and, for a borderline
    draw, lies within ``_BORDER_BAND`` of the threshold its design aimed at."""
    crit = acdc_criteria(truth)
    if not crit[group] or sum(crit.values()) != 1:
        return False
    return target is None or abs(truth[target[0]] - target[1]) <= _BORDER_BAND[target[0]]


def bsa_mosteller(height_cm: float, weight_kg: float) -> float:
    """Body surface area (m2), Mosteller: sqrt(height_cm * weight_kg / 3600)."""
    return float(np.sqrt(height_cm * weight_kg / 3600.0))


def acdc_criteria(values: dict[str, Any]) -> dict[str, bool]:
    """Which ACDC group definitions a set of truth values satisfies (one flag per group).

    Thresholds follow the ACDC challenge definitions (Bernard et al., IEEE TMI 2018): DCM
    LVEF < 40 % with LV EDV index > 100 mL/m2; HCM normal LVEF (> 55 %) with ED wall
    >= 15 mm or LV mass index >= 110 g/m2; MINF LVEF < 40 % with regional akinesia; RV
    RV EDV index > 110 mL/m2 or RVEF < 40 % with a preserved LV; NOR none of these.
    """
    ef, edvi = values["lv_ef_pct"], values["lv_edvi_ml_m2"]
    rv_edvi, rv_ef = values["rv_edvi_ml_m2"], values["rv_ef_pct"]
    rv_normal = rv_edvi <= 110 and rv_ef >= 40
    return {
        "NOR": 55 <= ef <= 70 and edvi <= 100 and values["max_wall_thickness_mm"] < 15 and rv_normal,
        "DCM": ef < 40 and edvi > 100,
        "HCM": ef > 55 and (values["max_wall_thickness_mm"] >= 15 or values["lv_mass_index_g_m2"] >= 110),
        "MINF": ef < 40 and bool(values.get("akinesia")),
        "RV": (rv_edvi > 110 or rv_ef < 40) and 50 <= ef,
    }


def _cycle(n_frames: int, ed_offset: int, es_phase: float) -> np.ndarray:
    """Contraction state per frame: 0 at end-diastole, 1 at end-systole (cosine ramps)."""
    phi = ((np.arange(n_frames) - ed_offset) % n_frames) / n_frames
    sys = 0.5 * (1 - np.cos(np.pi * np.minimum(phi / es_phase, 1.0)))
    dia = 0.5 * (1 + np.cos(np.pi * (phi - es_phase) / (1 - es_phase)))
    return np.where(phi <= es_phase, sys, dia)


def _draw_anatomy(group: str, rng: np.random.Generator, bsa: float,
                  design: dict[str, tuple[float, float]] | None = None, wall_scale: float = 1.0) -> dict[str, Any]:
    """Design parameters of one heart; ``design`` overrides group ranges (borderline draws)."""
    g = _GROUP_PARAMS[group]
    if design:
        g = replace(g, **design)
    edv = rng.uniform(*g.lv_edvi) * bsa * 1000.0  # mm3
    aspect = rng.uniform(2.3, 2.6) if group == "DCM" else rng.uniform(2.9, 3.3)  # L / a (DCM: spherical)
    # cavity volume = 0.8 * pi * a^2 * L for the sqrt(1 - x^4) taper
    a0 = (edv / (0.8 * np.pi * aspect)) ** (1 / 3)
    s_long = rng.uniform(0.86, 0.9) if group not in ("DCM", "MINF") else rng.uniform(0.93, 0.96)
    ef = rng.uniform(*g.lv_ef) / 100.0
    s_rad = np.sqrt((1 - ef) / s_long)
    rv_ef = rng.uniform(*g.rv_ef) / 100.0
    p: dict[str, Any] = {
        "a0": a0, "L0": aspect * a0, "s_rad": s_rad, "s_long": s_long,
        "wall": rng.uniform(*g.wall) * wall_scale, "septal_extra": rng.uniform(*g.septal_extra) * wall_scale,
        "rv_scale": rng.uniform(*g.rv_scale), "rv_s": (1 - rv_ef) ** (1 / 3),
        # RV size is set by the body, not the LV: the epicardial radius of a normal LV here
        "rv_ref": (75e3 * bsa / (0.8 * np.pi * 3.1)) ** (1 / 3) + 9.0,
        "es_phase": rng.uniform(0.32, 0.38), "akinesia": None,
    }
    if g.akinesia:
        p["akinesia"] = {"center_deg": float(rng.uniform(70, 290)), "width_deg": float(rng.uniform(90, 120)),
                         "x_range": (float(rng.uniform(0.25, 0.4)), 1.05), "scar_wall_mm": float(rng.uniform(4, 5.5))}
    return p


def _heart_frame(rng: np.random.Generator, oblique: bool) -> tuple[np.ndarray, np.ndarray]:
    """Heart axes (columns u=septal, v, w=base->apex) and the world point of the LV base centre."""
    if oblique:
        w = np.array([-0.55, 0.45, -0.7]) + rng.normal(0, 0.08, 3)  # towards left-anterior-inferior
    else:
        w = np.array([0.0, 0.0, -1.0])
    w /= np.linalg.norm(w)
    sept = np.array([1.0, 0.6, 0.0])  # towards patient right-anterior, where the RV lies
    u = sept - (sept @ w) * w
    u /= np.linalg.norm(u)
    frame = np.stack([u, np.cross(w, u), w], axis=1)
    base = np.array([-10.0, 10.0, 15.0]) + rng.normal(0, 4, 3)
    return frame, base


def _grid(size: Size, rng: np.random.Generator, oblique: bool, frame: np.ndarray, base: np.ndarray,
          p: dict[str, Any]) -> tuple[np.ndarray, tuple[int, int, int], int]:
    """Short-axis stack affine/shape covering base (with a margin) to apex; and frame count."""
    if size == "full":
        sp, dz, n_frames = rng.uniform(1.25, 1.6), rng.uniform(8.5, 10.0), int(rng.integers(20, 31))
        nx = 2 * int(round(rng.uniform(300, 350) / sp / 2))
        ny = 2 * int(round(nx * rng.uniform(0.8, 0.92) / 2))
        nz_lim = (8, 11)
    elif size == "small":
        sp, dz, n_frames = rng.uniform(2.9, 3.1), rng.uniform(11.0, 13.0), int(rng.integers(10, 13))
        nx, ny, nz_lim = 64, 56, (6, 8)
    else:
        raise ToolError(ErrorCode.value_range, f"unknown size {size!r}", hint="valid: ['full', 'small']", arg="size")
    heart = p["L0"] + p["wall"]  # ED base plane to the epicardial apex
    nz = int(np.clip(np.ceil(heart / dz + 1.5), *nz_lim))
    dz = max(dz, heart / (nz - 1.5))  # coarser slices rather than a truncated heart
    length = heart + 0.5 * dz  # with a margin of half a slice above the base
    direction = np.eye(3)  # axis-aligned stack (the heart's long axis is then along -S)
    if oblique:  # the planned stack is a few degrees off the true long axis, axes flipped as on scanners
        direction = frame @ random_direction(rng, oblique_deg=5.0, flips=True)
    # centre in-plane between LV and RV, through-plane on the covered length
    centre = base + frame[:, 2] * (length / 2 - 0.5 * dz) + frame[:, 0] * 0.3 * p["a0"] * p["rv_scale"]
    return make_affine(direction, (sp, sp, dz), (nx, ny, nz), centre), (nx, ny, nz), n_frames


def _lv_radii(r: np.ndarray, theta: np.ndarray, w: np.ndarray, c: float, p: dict[str, Any],
              akin: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(LV, MYO) boolean maps at contraction state ``c`` (0 = ED, 1 = ES)."""
    L_apex = p["L0"]  # the endocardial apex is fixed; the base descends towards it
    th0 = p["wall"] + p["septal_extra"] * np.clip(np.cos(theta), 0, None) ** 2
    states = [(c, th0)]
    if akin is not None:  # the akinetic sector stays at its diastolic shape with a thin scar
        states.append((0.0, np.full_like(th0, p["akinesia"]["scar_wall_mm"])))
    parts = []
    for ci, th_ed in states:
        a = p["a0"] * (1 - ci * (1 - p["s_rad"]))
        L = p["L0"] * (1 - ci * (1 - p["s_long"]))
        x = (w - (L_apex - L)) / L
        g = np.sqrt(np.clip(1 - np.clip(x, 0, 1) ** 4, 0, None))
        r_endo = np.where((x >= 0) & (x <= 1), a * g, 0.0)
        # ring area conservation: (r+th)^2 - r^2 is the same as at ED for this material point,
        # times ``thickening_gain`` at full contraction (training label cines only, see
        # cardiac_family.anatomy_label_cine; 1 for every phantom)
        gain = 1.0 + ci * (p.get("thickening_gain", 1.0) - 1.0)
        if gain == 1.0:  # the phantoms: the same arithmetic, bit for bit
            th = np.sqrt((a * g) ** 2 + 2 * p["a0"] * g * th_ed + th_ed ** 2) - a * g
        else:
            th = np.sqrt((a * g) ** 2 + gain * (2 * p["a0"] * g * th_ed + th_ed ** 2)) - a * g
        cap = th_ed * np.sqrt(np.clip(1 - ((w - L_apex) / p["wall"]) ** 2, 0, None))
        r_epi = np.where(x <= 1, r_endo + th, cap)
        parts.append((r_endo, np.where(x >= 0, r_epi, 0.0)))
    r_endo, r_epi = parts[0]
    if akin is not None:
        r_endo = (1 - akin) * r_endo + akin * parts[1][0]
        r_epi = (1 - akin) * r_epi + akin * parts[1][1]
    lv = r < r_endo
    return lv, (r < r_epi) & ~lv


def _rv(q: np.ndarray, c: float, p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(RV cavity ellipse, RV cavity + free wall ellipse), before removing the LV.

    The RV is sized for the body (``rv_ref``: the epicardial radius of a normal LV for this
    BSA), and its ellipse follows the septum as the LV epicardium moves, so RV function is
    set by ``rv_s`` rather than by the LV's motion.
    """
    a_c = p["a0"] * (1 - c * (1 - p["s_rad"]))
    epi_c = np.sqrt(a_c ** 2 + 2 * p["a0"] * p["wall"] + p["wall"] ** 2)  # ring-area conservation
    k = p["rv_scale"] * (1 - c * (1 - p["rv_s"])) * p["rv_ref"]
    A, B, L = 1.05 * k, 1.65 * k, 0.85 * p["L0"] * (1 - c * (1 - p["s_long"]))
    base_w = p["L0"] - p["L0"] * (1 - c * (1 - p["s_long"]))  # moves with the LV base
    x = (q[..., 2] - base_w) / L
    taper = np.where((x >= 0) & (x <= 1), 1 - np.clip(x, 0, 1) ** 2, -1.0)
    d = 0.5 * epi_c
    e_in = ((q[..., 0] - d) / A) ** 2 + (q[..., 1] / B) ** 2
    e_out = ((q[..., 0] - d) / (A + 3.0)) ** 2 + (q[..., 1] / (B + 3.0)) ** 2
    return e_in <= taper, e_out <= taper


def _akinesia_weight(theta: np.ndarray, w: np.ndarray, p: dict[str, Any]) -> np.ndarray | None:
    ak = p["akinesia"]
    if ak is None:
        return None
    dth = np.rad2deg(np.angle(np.exp(1j * (theta - np.deg2rad(ak["center_deg"])))))
    edge = 15.0  # smooth border so the infarct blends into hypokinetic remote myocardium
    s_th = np.clip((ak["width_deg"] / 2 + edge / 2 - np.abs(dth)) / edge, 0, 1)
    x = w / p["L0"]
    s_w = np.clip((x - ak["x_range"][0]) / 0.1, 0, 1) * np.clip((ak["x_range"][1] - x) / 0.1, 0, 1)
    return s_th * s_w


def _background(world: np.ndarray) -> np.ndarray:
    """Static intensity image of the thorax (world coordinates, no heart)."""
    x, y = world[..., 0], world[..., 1]
    img = np.zeros(world.shape[:3], dtype=np.float32)
    body = (x / 165.0) ** 2 + (y / 120.0) ** 2
    img[body <= 1] = INTENSITY["fat"]
    img[((x / 153.0) ** 2 + (y / 108.0) ** 2) <= 1] = INTENSITY["body"]
    for cx in (80.0, -90.0):
        lung = ((x - cx) / 58.0) ** 2 + ((y + 10.0) / 72.0) ** 2 + (world[..., 2] / 150.0) ** 2
        img[lung <= 1] = INTENSITY["lung"]
    img[((x + 15.0) ** 2 + (y + 62.0) ** 2) <= 11.0 ** 2] = INTENSITY["aorta"]
    return img


def max_wall_thickness_mm(lv: np.ndarray, myo: np.ndarray, spacing_xy: tuple[float, float],
                          min_cavity_frac: float = 0.1) -> float:
    """Largest in-plane distance (mm) from a myocardial voxel to the LV cavity, over slices.

    Per short-axis slice, the Euclidean distance transform of the non-cavity region gives,
    at each myocardial voxel, its distance to the endocardium; the outermost voxels hold the
    local wall thickness. Slices whose cavity is below ``min_cavity_frac`` of the largest
    cavity cross-section are skipped: there the plane grazes the base or the apical cap
    obliquely and the in-plane "thickness" is not a wall thickness.
    """
    areas = lv.sum(axis=(0, 1))
    best = 0.0
    for k in np.flatnonzero(areas >= max(1.0, min_cavity_frac * float(areas.max(initial=0)))):
        if not myo[..., k].any():
            continue
        dist = ndimage.distance_transform_edt(~lv[..., k], sampling=spacing_xy)
        best = max(best, float(dist[myo[..., k]].max()))
    return best


def cardiac_truth(seg: Mask, height_cm: float, weight_kg: float) -> dict[str, Any]:
    """Volumes, EF, mass, thickness and indices measured on a (X,Y,Z,T) label cine.

    ED/ES are the frames of maximum/minimum LV cavity volume; RV values are read at the same
    frames (the ACDC convention). Volumes in mL, mass in g (1.05 g/mL, at ED), EF in %.
    """
    data = np.asarray(seg.data)
    if data.ndim != 4:
        raise ToolError(ErrorCode.shape, f"cardiac labels must be (X,Y,Z,T), got {data.shape}", arg="seg")
    vox = seg.voxel_volume_ml
    lv = np.count_nonzero(data == 3, axis=(0, 1, 2)) * vox
    rv = np.count_nonzero(data == 1, axis=(0, 1, 2)) * vox
    ed, es = int(np.argmax(lv)), int(np.argmin(lv))
    bsa = bsa_mosteller(height_cm, weight_kg)
    ed_lab = data[..., ed]
    myo_ml = float(np.count_nonzero(ed_lab == 2) * vox)
    sx, sy, _ = seg.spacing
    wall = max_wall_thickness_mm(ed_lab == 3, ed_lab == 2, (sx, sy))
    v = {
        "ed_frame": ed, "es_frame": es, "n_frames": int(data.shape[3]),
        "lv_edv_ml": float(lv[ed]), "lv_esv_ml": float(lv[es]),
        "lv_ef_pct": float(100 * (lv[ed] - lv[es]) / lv[ed]) if lv[ed] > 0 else 0.0,
        "rv_edv_ml": float(rv[ed]), "rv_esv_ml": float(rv[es]),
        "rv_ef_pct": float(100 * (rv[ed] - rv[es]) / rv[ed]) if rv[ed] > 0 else 0.0,
        "myo_volume_ml": myo_ml, "myo_mass_g": myo_ml * MYO_DENSITY_G_ML,
        "max_wall_thickness_mm": wall, "height_cm": float(height_cm), "weight_kg": float(weight_kg),
        "bsa_m2": bsa, "lv_volume_curve_ml": [float(x) for x in lv],
        "rv_volume_curve_ml": [float(x) for x in rv],
    }
    v.update(lv_edvi_ml_m2=v["lv_edv_ml"] / bsa, rv_edvi_ml_m2=v["rv_edv_ml"] / bsa,
             lv_mass_index_g_m2=v["myo_mass_g"] / bsa)
    return v


def _frame_labels(q: np.ndarray, r: np.ndarray, theta: np.ndarray, c: float, p: dict[str, Any],
                  akin: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Label volume (0/1/2/3) and RV-free-wall map at contraction state ``c``."""
    lv, myo = _lv_radii(r, theta, q[..., 2], c, p, akin)
    rv_in, rv_out = _rv(q, c, p)
    heart = lv | myo
    lab = np.zeros(r.shape, dtype=np.uint8)
    lab[rv_in & ~heart] = 1
    lab[myo] = 2
    lab[lv] = 3
    return lab, rv_out & ~rv_in & ~heart


def _render(lab: np.ndarray, rv_wall: np.ndarray, background: np.ndarray, gain: dict[str, float]) -> np.ndarray:
    img = background.copy()
    img[rv_wall] = gain["rv_wall"]
    for value, name in ((1, "rv"), (2, "myo"), (3, "lv")):
        img[lab == value] = gain[name]
    # in-plane point-spread blur: edges get partial-volume values like real bSSFP
    return ndimage.gaussian_filter(img, sigma=(0.6, 0.6, 0.0))


def _akinetic_slices(akin: np.ndarray | None, lab_ed: np.ndarray) -> list[int]:
    if akin is None:
        return []
    hit = (akin > 0.5) & (lab_ed >= 2)
    return [int(k) for k in np.flatnonzero(hit.any(axis=(0, 1)))]


def make_cardiac(case_id: str, seed: int, size: Size = "small", group: str | None = None,
                 oblique: bool = True, noise: float | None = None, family: str = "base",
                 borderline: bool = False) -> Phantom:
    """An ACDC-like short-axis cine with per-frame labels and exact measured truth.

    Args:
        case_id: identifier recorded in the phantom.
        seed: everything (anatomy, body size, geometry, noise) is drawn from it.
        size: ``small`` (64x56 in-plane, ~3 mm, 6-8 slices, 10-12 frames; well under 1 s) or
            ``full`` (1.25-1.6 mm, 8.5-10 mm slices (up to ~11 if a dilated heart needs it), 8-11 slices, 20-30 frames).
            Non-base families draw their own ranges per size (``FAMILY_RANGES``).
        group: NOR | DCM | HCM | MINF | RV; drawn from the seed when None.
        oblique: oblique, flipped short-axis geometry (else an axis-aligned stack; base family only).
        noise: Rician noise std as a fraction of the blood intensity (None: 0.02 for the base
            family, the family's range otherwise).
        family: ``base`` | ``randomised`` | ``heldout`` (module docstring; never tune on ``heldout``).
        borderline: EF/volumes drawn near the ACDC thresholds (still meeting exactly this group).

    Returns:
        Phantom with ``sequences={"CINE": Cine}``, ``labels={"seg": Mask (X,Y,Z,T)}`` (1 RV,
        2 MYO, 3 LV), metadata height (cm) / weight (kg), and truth from :func:`cardiac_truth`
        plus group, ACDC criteria flags, akinesia and the heart frame (non-base families also
        ``family``, ``acquisition`` (trigger delay, curve model, slice order, ...) and
        ``ed_es_margin_ml``, the volume gap to the next-best ED/ES frame).
    """
    if family not in FAMILIES:
        raise ToolError(ErrorCode.value_range, f"unknown phantom family {family!r}", hint=f"valid: {list(FAMILIES)}",
                        arg="family", case=case_id)
    rng = np.random.default_rng([seed, 0xCA2D])
    if group is None:
        group = GROUPS[int(rng.integers(len(GROUPS)))]
    if group not in GROUPS:
        raise ToolError(ErrorCode.value_range, f"unknown ACDC group {group!r}", hint=f"valid: {list(GROUPS)}",
                        arg="group", case=case_id)
    if size not in ("small", "full"):
        raise ToolError(ErrorCode.value_range, f"unknown size {size!r}", hint="valid: ['full', 'small']",
                        arg="size", case=case_id)
    if family != "base":
        from .generators import family_builder

        return family_builder("cardiac")(case_id, seed, size, group, family, noise, borderline)
    variants = _BORDERLINE[group]
    for _ in range(25 if borderline else 1):
        design, target = variants[int(rng.integers(len(variants)))] if borderline else (None, None)
        ph = _base_case(case_id, rng, size, group, oblique, 0.02 if noise is None else noise, design)
        if not borderline or borderline_ok(ph.truth, group, target):
            break
    else:
        raise ToolError(ErrorCode.internal, f"no borderline {group} heart in 25 draws", case=case_id,
                        hint="try another seed")
    if borderline:
        ph.truth.update(borderline=True, borderline_design={k: list(v) for k, v in design.items()},
                        borderline_target={"value": target[0], "threshold": target[1]})
    return ph


def _base_case(case_id: str, rng: np.random.Generator, size: Size, group: str, oblique: bool, noise: float,
               design: dict[str, tuple[float, float]] | None) -> Phantom:
    """The base family's cine (the original generator; draws in the original order)."""
    height, weight = float(round(rng.uniform(155, 192))), float(round(rng.uniform(52, 105)))
    p = _draw_anatomy(group, rng, bsa_mosteller(height, weight), design)
    frame, base = _heart_frame(rng, oblique)
    affine, shape, n_frames = _grid(size, rng, oblique, frame, base, p)
    world = world_coords(affine, shape)
    q = (world - base) @ frame  # heart-frame coordinates (u septal, v, w base->apex), mm
    r, theta = np.hypot(q[..., 0], q[..., 1]), np.arctan2(q[..., 1], q[..., 0])
    akin = _akinesia_weight(theta, q[..., 2], p)
    background = _background(world)
    gain = {k: v * rng.uniform(0.92, 1.08) for k, v in INTENSITY.items()}
    states = _cycle(n_frames, int(rng.integers(0, 2)), p["es_phase"])
    labs, imgs = [], []
    for c in states:
        lab, rv_wall = _frame_labels(q, r, theta, float(c), p, akin)
        labs.append(lab)
        imgs.append(_render(lab, rv_wall, background, gain))
    seg = Mask(np.stack(labs, axis=-1), affine, {"case_id": case_id}, labels=dict(LABELS))
    cine_data = rician_noise(np.stack(imgs, axis=-1), noise * gain["lv"], rng)
    rr = float(rng.uniform(750, 1000))
    cine = Cine(cine_data, affine.copy(), {"case_id": case_id, "sequence": "bSSFP cine",
                                           "rr_ms": rr, "frame_ms": rr / n_frames})
    truth = cardiac_truth(seg, height, weight)
    truth.update(group=group, akinesia=None, heart_frame={
        "base_centre_world": base.tolist(), "septal_axis": frame[:, 0].tolist(),
        "long_axis": frame[:, 2].tolist()})
    if p["akinesia"] is not None:
        ak = p["akinesia"]
        truth["akinesia"] = {"sector_centre_deg": ak["center_deg"], "sector_width_deg": ak["width_deg"],
                             "slices": _akinetic_slices(akin, labs[truth["ed_frame"]])}
    truth["acdc_criteria"] = acdc_criteria(truth)
    log.debug("cardiac %s %s: EF %.1f%% EDV %.0f mL", case_id, group, truth["lv_ef_pct"], truth["lv_edv_ml"])
    return Phantom(case_id, "cardiac", {"CINE": cine}, {"seg": seg},
                   {"height": height, "weight": weight}, truth)
