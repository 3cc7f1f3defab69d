"""Domain-randomised pelvic anatomy and scanner geometry for the prostate phantom families.

``bcer.datasets.prostate.make_prostate(..., family="randomised" | "heldout")`` builds its case
here; the parameter ranges of each family live in ``prostate.FAMILIES`` (one table). What
varies, per case:

- anatomy (world space, RAS+ mm, the patient's midline at x = 0): gland size, shape
  (lobulation), tilt and TZ share; an optional dark capsule rim; the rectum (wall, gas pocket
  rising anteriorly, faecal/fluid content) behind the gland, tilted; the bladder above it
  (optional, variable size and distance); the seminal vesicles (optional); the obturator
  internus muscles; pelvic bone with cortex and marrow (pubic symphysis, femoral heads,
  ischial tuberosities); fat inside an elliptic body outline with air outside;
  held-out anatomy variants (TZ nodules, calcifications) when the family asks for them;
- scanner geometry: each series on its own oblique grid (tilt of the slice plane, in-plane
  rotation, flips), with its own field of view, voxel size, slice count and centre (the gland
  is not at the centre of the field of view; the diffusion series has another centre), and
  its own slice-numbering direction (the handedness of the grid: DICOM files of a
  ``descending`` series are numbered against the slice normal);
- intensity conventions: tissue contrast jitter, a global scale per series (T2w, DWI), a
  smooth multiplicative bias field (polynomial, or a posterior receive-coil fall-off), noise,
  the diffusion b-value, the series descriptions.

Every label is exact: the analytic anatomy is evaluated at each grid's voxel centres.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy.spatial.transform import Rotation

from .degrade import rician_noise
from .geometry import make_affine, world_coords

log = logging.getLogger(__name__)

__all__ = ["PelvisAnatomy", "random_pelvis", "family_grid", "gland_inside", "Tube"]

# Tissue classes of the family anatomy: name -> (T2w, ADC in 1e-6 mm^2/s, DWI S0), before jitter.
PELVIS_TISSUES: dict[str, tuple[float, float, float]] = {
    "air": (0.0, 0.0, 0.0), "fat": (750.0, 350.0, 60.0), "muscle": (220.0, 1400.0, 600.0),
    "cortex": (70.0, 250.0, 30.0), "marrow": (620.0, 450.0, 70.0),
    "rectal_wall": (300.0, 1200.0, 700.0), "gas": (0.0, 0.0, 0.0), "rectal_content": (350.0, 1700.0, 500.0),
    "bladder": (1400.0, 2900.0, 1500.0), "seminal_vesicle": (1250.0, 1900.0, 900.0),
    "capsule": (330.0, 1300.0, 600.0), "PZ": (920.0, 1650.0, 1000.0), "TZ": (540.0, 1200.0, 800.0),
    "calcification": (60.0, 300.0, 20.0),
}
_CLASS = {name: i for i, name in enumerate(PELVIS_TISSUES)}


def _u(rng: np.random.Generator, r: tuple[float, float]) -> float:
    return float(rng.uniform(r[0], r[1]))


def _logu(rng: np.random.Generator, r: tuple[float, float]) -> float:
    return float(np.exp(rng.uniform(np.log(r[0]), np.log(r[1]))))


@dataclass
class Tube:
    """An elliptic cylinder along (tilted) S-I between ``z0`` and ``z1`` (world z)."""

    xy: np.ndarray  # centre at z = zc
    zc: float
    semi: tuple[float, float]
    slope: tuple[float, float]  # dx/dz, dy/dz
    z0: float
    z1: float

    def rho2(self, pts: np.ndarray) -> np.ndarray:
        dz = pts[..., 2] - self.zc
        x = (pts[..., 0] - self.xy[0] - self.slope[0] * dz) / self.semi[0]
        y = (pts[..., 1] - self.xy[1] - self.slope[1] * dz) / self.semi[1]
        r = x * x + y * y
        r[(pts[..., 2] < self.z0) | (pts[..., 2] > self.z1)] = np.inf
        return r


@dataclass
class _Ellipsoid:
    center: np.ndarray
    semi: np.ndarray
    rot: np.ndarray = field(default_factory=lambda: np.eye(3))

    def rho2(self, pts: np.ndarray) -> np.ndarray:
        local = (pts - self.center) @ self.rot / self.semi
        return np.einsum("...i,...i->...", local, local)


@dataclass
class PelvisAnatomy:
    """The case's anatomy; ``classes``/``lesion_labels``/``lesions`` follow the interface of
    ``prostate._Anatomy`` so the lesion placement is shared."""

    center: np.ndarray
    gland: Any  # prostate._Blob
    tz: Any
    capsule_mm: float
    body: _Ellipsoid
    rectum: Tube
    rectal_wall_mm: float
    gas_level: float  # fraction of the lumen's A-P extent (from anterior) holding gas
    bladder: Any | None
    vesicles: list[Any]
    muscles: list[Tube]
    bones: list[tuple[_Ellipsoid, float]]  # (outer shape, cortex thickness mm)
    nodules: list[tuple[Any, tuple[float, float, float]]]  # (blob inside the TZ, tissue values)
    values: dict[str, tuple[float, float, float]]
    lesions: list[Any] = field(default_factory=list)
    bias_kind: str | None = None  # drawn on first use when the family offers several

    def classes(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tissue class index and zone label (0/1 PZ/2 TZ) at world points (..., 3)."""
        cls = np.full(pts.shape[:-1], _CLASS["air"], dtype=np.int8)
        cls[self.body.rho2(pts) < 1] = _CLASS["fat"]
        for m in self.muscles:
            cls[m.rho2(pts) < 1] = _CLASS["muscle"]
        for shape, cortex in self.bones:
            r2 = shape.rho2(pts)
            cls[r2 < 1] = _CLASS["cortex"]
            inner = (1.0 - cortex / float(shape.semi.min())) ** 2
            cls[r2 < inner] = _CLASS["marrow"]
        r2 = self.rectum.rho2(pts)
        wall = self.rectal_wall_mm / min(self.rectum.semi)
        cls[r2 < 1] = _CLASS["rectal_wall"]
        lumen = r2 < (1.0 - wall) ** 2
        cls[lumen] = _CLASS["rectal_content"]
        dz = pts[..., 2] - self.rectum.zc
        ylocal = (pts[..., 1] - self.rectum.xy[1] - self.rectum.slope[1] * dz) / self.rectum.semi[1]
        cls[lumen & (ylocal > 1.0 - 2.0 * self.gas_level)] = _CLASS["gas"]  # gas rises anteriorly (supine)
        for v in self.vesicles:
            cls[v.inside(pts)] = _CLASS["seminal_vesicle"]
        if self.bladder is not None:
            cls[self.bladder.inside(pts)] = _CLASS["bladder"]
        gland = self.gland.inside(pts)
        if self.capsule_mm > 0:
            cls[self._capsule(pts) & ~gland] = _CLASS["capsule"]
        tz = gland & self.tz.inside(pts)
        cls[gland] = _CLASS["PZ"]
        cls[tz] = _CLASS["TZ"]
        zones = np.where(tz, 2, np.where(gland, 1, 0)).astype(np.int16)
        return cls, zones

    def _capsule(self, pts: np.ndarray) -> np.ndarray:
        from .prostate import _Blob

        grown = _Blob(self.gland.center, self.gland.semi + self.capsule_mm, self.gland.rot, self.gland.ripple)
        return grown.inside(pts)

    def lesion_labels(self, pts: np.ndarray, zones: np.ndarray) -> np.ndarray:
        out = np.zeros(pts.shape[:-1], dtype=np.int16)
        for i, les in enumerate(self.lesions, start=1):
            out[les.blob.inside(pts) & (zones > 0) & (out == 0)] = i
        return out

    def tissue_maps(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Noise-free T2w, ADC and S0 at world points, plus zones and lesion labels."""
        cls, zones = self.classes(pts)
        lesions = self.lesion_labels(pts, zones)
        table = np.array([self.values[name] for name in PELVIS_TISSUES], dtype=np.float64)
        t2, adc, s0 = (table[cls, c] for c in range(3))
        for blob, vals in self.nodules:  # variants inside the gland keep their zone label
            m = blob.inside(pts) & (zones > 0)
            t2[m], adc[m], s0[m] = vals
        for i, les in enumerate(self.lesions, start=1):
            m = lesions == i
            zt2, _, zs0 = self.values[les.zone]
            t2[m], adc[m], s0[m] = les.t2_ratio * zt2, les.adc, zs0
        return t2, adc, s0, zones, lesions


def _jitter(rng: np.random.Generator, R: dict[str, Any]) -> dict[str, tuple[float, float, float]]:
    values = {}
    for name, (t2, adc, s0) in PELVIS_TISSUES.items():
        j = R["tissue_jitter"]
        values[name] = (t2 * rng.uniform(1 - j, 1 + j), adc * rng.uniform(1 - j / 2, 1 + j / 2),
                        s0 * rng.uniform(1 - j, 1 + j))
    fat = _u(rng, R["fat_t2"])
    values["fat"] = (fat, values["fat"][1], values["fat"][2])
    values["PZ"] = (fat * _u(rng, R["pz_fat_ratio"]), _u(rng, R["pz_adc"]), 1000.0)
    values["TZ"] = (fat * _u(rng, R["tz_fat_ratio"]), _u(rng, R["tz_adc"]), 800.0)
    return values


def random_pelvis(rng: np.random.Generator, R: dict[str, Any], blob_cls: Callable[..., Any]) -> PelvisAnatomy:
    """A random pelvis of one family (``R``: its row of ``prostate.FAMILIES``)."""
    c = np.array([_u(rng, (-2.0, 2.0)), _u(rng, (-10.0, 10.0)), _u(rng, (-10.0, 10.0))])
    a, b, h = (_u(rng, r) for r in R["gland_semi_mm"])
    gland = blob_cls.random(rng, c, (a, b, h), max_tilt_deg=R["gland_tilt_deg"], ripple=_u(rng, R["gland_ripple"]))
    tzs = _u(rng, R["tz_scale"])
    tz = blob_cls.random(rng, c + gland.rot @ np.array([0.0, 0.3 * b, 0.1 * h]),
                         (tzs * a, (tzs - 0.03) * b, (tzs + 0.07) * h), max_tilt_deg=5, ripple=0.03)
    capsule = _u(rng, R["capsule_mm"]) if rng.random() < R["p_capsule"] else 0.0
    body = _Ellipsoid(np.array([c[0], c[1] + _u(rng, (15, 35)), c[2]]),
                      np.array([_u(rng, (150, 190)), _u(rng, (105, 135)), 1e4]))
    rx, ry = _u(rng, R["rectum_semi_mm"][0]), _u(rng, R["rectum_semi_mm"][1])
    rectum = Tube(np.array([c[0] + _u(rng, (-4, 4)), c[1] - b - _u(rng, (2, 6)) - ry]), c[2], (rx, ry),
                  (_u(rng, (-0.15, 0.15)), _u(rng, (-0.25, 0.1))), -1e4, 1e4)
    wall = _u(rng, (2.5, 4.0))
    gas = _u(rng, R["gas_fraction"])
    bladder = None
    if rng.random() < R["p_bladder"]:
        semi = np.array([_u(rng, (24, 40)), _u(rng, (18, 30)), _u(rng, (14, 26))])
        bladder = blob_cls.random(rng, c + np.array([_u(rng, (-5, 5)), _u(rng, (2, 12)), h + semi[2] + _u(rng, R["bladder_gap_mm"])]),
                                  semi, 8, 0.05)
    vesicles = []
    if rng.random() < R["p_vesicles"]:
        for sign in (-1.0, 1.0):
            semi = np.array([_u(rng, (11, 17)), _u(rng, (3.5, 6.5)), _u(rng, (4.5, 8))])
            centre = c + np.array([sign * _u(rng, (10, 17)), -0.55 * b, 0.8 * h + _u(rng, (2, 7))])
            v = blob_cls.random(rng, centre, semi, 10, 0.06)
            v.rot = Rotation.from_euler("z", sign * _u(rng, (10, 35)), degrees=True).as_matrix() @ v.rot
            vesicles.append(v)
    muscles = []
    for sign in (-1.0, 1.0):
        muscles.append(Tube(np.array([c[0] + sign * (a + _u(rng, (14, 24))), c[1] + _u(rng, (-8, 8))]), c[2],
                            (_u(rng, (6, 10)), _u(rng, (18, 28))), (sign * _u(rng, (0.0, 0.2)), 0.0), -1e4, 1e4))
    bones = [(_Ellipsoid(c + np.array([0.0, b + _u(rng, (10, 18)), _u(rng, (-5, 10))]),
                         np.array([_u(rng, (5, 8)), _u(rng, (8, 11)), _u(rng, (18, 25))])), 2.0)]
    for sign in (-1.0, 1.0):
        r = _u(rng, (20, 25))
        bones.append((_Ellipsoid(c + np.array([sign * (a + _u(rng, (42, 58))), _u(rng, (0, 15)), _u(rng, (10, 30))]),
                                 np.array([r, r, r])), 3.0))
        bones.append((_Ellipsoid(c + np.array([sign * _u(rng, (40, 55)), -_u(rng, (15, 30)), -_u(rng, (15, 35))]),
                                 np.array([_u(rng, (9, 13)), _u(rng, (12, 16)), _u(rng, (18, 24))])), 2.5))
    values = _jitter(rng, R)
    nodules = []
    for _ in range(int(rng.integers(R["tz_nodules"][0], R["tz_nodules"][1] + 1))):
        centre = tz.center + tz.rot @ (rng.uniform(-0.5, 0.5, 3) * tz.semi)
        semi = np.full(3, _u(rng, (3.0, 7.0)))
        t2, adc, s0 = values["TZ"]
        nodules.append((blob_cls.random(rng, centre, semi, 45, 0.1),
                        (t2 * _u(rng, (0.8, 1.3)), adc * _u(rng, (0.96, 1.06)), s0)))
    for _ in range(int(rng.integers(R["calcifications"][0], R["calcifications"][1] + 1))):
        centre = tz.center + tz.rot @ (rng.uniform(-0.7, 0.7, 3) * tz.semi)
        nodules.append((blob_cls.random(rng, centre, np.full(3, _u(rng, (1.0, 2.0))), 0, 0.0),
                        values["calcification"]))
    return PelvisAnatomy(c, gland, tz, capsule, body, rectum, wall, gas, bladder, vesicles, muscles, bones,
                         nodules, values)


def _direction(rng: np.random.Generator, tilt_deg: tuple[float, float], descending: bool) -> np.ndarray:
    """DICOM axial (rows to patient left, columns posterior) tilted about an in-plane axis by
    ``tilt_deg`` (the slice plane's obliquity), turned in-plane a little, flipped at random,
    with the slice axis along (ascending) or against (descending) the in-plane cross product."""
    d = np.diag([-1.0, -1.0, 1.0])
    phi = rng.uniform(0, 2 * np.pi)
    tilt = Rotation.from_rotvec(np.deg2rad(_u(rng, tilt_deg)) * np.array([np.cos(phi), np.sin(phi), 0.0]))
    spin = Rotation.from_rotvec(np.deg2rad(rng.uniform(-10, 10)) * np.array([0.0, 0.0, 1.0]))
    d = (tilt * spin).as_matrix() @ d
    d[:, :2] *= rng.choice([-1.0, 1.0], size=2)[None, :]
    if (np.linalg.det(d) < 0) != descending:
        d[:, 2] *= -1.0
    return d


def family_grid(rng: np.random.Generator, base: tuple[tuple[float, ...], tuple[int, ...]], R: dict[str, Any],
                center: np.ndarray, descending: bool) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Affine and shape of one series of a family: its own voxel size, field of view, obliquity,
    flips, numbering direction and centre."""
    (sx, sy, sz), (nx, ny, nz) = base
    s_in, s_thk = _u(rng, R["spacing_scale"]), _u(rng, R["slice_scale"])
    fov = _u(rng, R["fov_scale"])
    shape = (int(round(nx * fov / s_in / 2)) * 2, int(round(ny * fov / s_in / 2)) * 2,
             max(8, nz + int(rng.integers(R["extra_slices"][0], R["extra_slices"][1] + 1))))
    spacing = (sx * s_in, sy * s_in, sz * s_thk)
    return make_affine(_direction(rng, R["oblique_deg"], descending), spacing, shape, center), shape


def gland_inside(gland_mask: np.ndarray, margin: int = 2) -> bool:
    """True when no gland voxel lies within ``margin`` voxels of the grid's faces."""
    m = gland_mask
    if not m.any():
        return False
    for ax in range(3):
        k = min(margin, m.shape[ax] // 4)
        lo = np.take(m, range(k), axis=ax)
        hi = np.take(m, range(m.shape[ax] - k, m.shape[ax]), axis=ax)
        if lo.any() or hi.any():
            return False
    return True


def _bias_kind(anat: PelvisAnatomy, rng: np.random.Generator, R: dict[str, Any]) -> str:
    """The family's bias kind; with a choice of kinds, one per case (drawn once, every grid shares it)."""
    kinds = R["bias_kind"]
    if isinstance(kinds, str):
        return kinds
    if anat.bias_kind is None:
        anat.bias_kind = str(rng.choice(list(kinds)))
    return anat.bias_kind


def bias(pts: np.ndarray, anat: PelvisAnatomy, rng: np.random.Generator, R: dict[str, Any]) -> np.ndarray:
    """Smooth multiplicative field at world points: a random low-order polynomial log-field
    (``poly``) or a posterior receive coil's fall-off (``coil``), scaled by the family range."""
    amp = _u(rng, R["bias"])
    q = (pts - anat.center) / 100.0
    if _bias_kind(anat, rng, R) == "coil":
        coil = np.array([0.0, -float(anat.gland.semi[1]) - _u(rng, (25, 45)), 0.0]) / 100.0
        d = np.linalg.norm(q - coil, axis=-1)
        return (1.0 + 2.0 * amp * np.exp(-d / _u(rng, (0.4, 0.8)))).astype(np.float32)
    g = rng.normal(size=3)
    h = rng.normal(size=3) / 2
    log_f = q @ g + (q * q) @ h
    log_f = log_f / max(float(np.abs(log_f).max()), 1e-6) * np.log1p(amp)
    return np.exp(log_f).astype(np.float32)


def render(anat: PelvisAnatomy, pts: np.ndarray, rng: np.random.Generator, look: dict[str, Any],
           R: dict[str, Any]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """T2w, ADC and DWI at world points (one series grid), with that grid's zones and lesions.

    ``look`` holds the case's draws that every grid shares (noise, scales, b-value)."""
    t2, adc, s0, zones, lesions = anat.tissue_maps(pts)
    field_ = bias(pts, anat, rng, R)
    dwi = s0 * np.exp(-look["b_value"] * adc * 1e-6)
    pz_t2, pz_s0 = anat.values["PZ"][0], anat.values["PZ"][2]
    out = {
        "T2w": look["t2_scale"] * rician_noise(t2 * field_, look["noise"] * pz_t2, rng),
        "DWI": look["dwi_scale"] * rician_noise(dwi * field_, look["noise"] * 0.5 * pz_s0, rng),
        "ADC": np.clip(adc + rng.normal(0.0, look["adc_sd"], adc.shape), 0, None).astype(np.float32),
    }
    if look["adc_integer"]:
        out["ADC"] = np.rint(out["ADC"]).astype(np.float32)
    return {k: v.astype(np.float32) for k, v in out.items()}, zones, lesions


def world_points(affine: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return world_coords(affine, shape)
