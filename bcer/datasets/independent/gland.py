"""Independent prostate cases: a spherical-harmonic gland with zones and lesions, T2w, ADC, DWI.

Shape model (written apart from ``bcer.datasets.prostate`` and ``pelvis``): the gland is a
star-shaped blob whose radius along each direction is an ellipsoid's times
``1 + sum c_lm Y_lm`` over real spherical harmonics of degree 2-4; the transition zone is a
smaller blob of its own, shifted anteriorly and kept inside the gland; the peripheral zone
is the rest. Lesions are ellipsoids cut to the gland, in the zone they are placed in.
Around it: a fat-rimmed body, obturator muscles, a rectum (wall and air) behind, a bladder
above and in front, the pubic bone in front. T2w is a thin-slice axial stack; ADC and DWI
(b = 800-1500) share the patient position and have their own coarser grid. Truth: volumes
counted on the T2w label maps written, each lesion's side relative to the gland's centroid
in the patient frame (RAS +x is the patient's right), PI-RADS by the rule stated in
``pirads_rule``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import lpmv

from ...contracts.artifacts import Image, Mask
from ..phantom import Phantom
from .acquire import (Grid, acquire, centred_grid, max_diameter_mm, oriented, rotation, sample_labels,
                      voxel_box)

PZ, TZ, LESION0 = 1, 2, 10  # anatomy labels; lesion k is LESION0 + k
FAT, BODY, MUSCLE, WALL, AIR, URINE, BONE = 3, 4, 5, 6, 7, 8, 9

# Ranges of the independent family. FIXED BEFORE ANY SCORE WAS LOOKED AT; they must not be
# changed after seeing a score (a change that raises a score by narrowing a range is a defect).
SHAPE = {"semi_lr_mm": (20.0, 31.0), "semi_ap_mm": (14.0, 22.0), "semi_si_mm": (16.0, 27.0), "harmonic_sd": 0.07,
         "tz_scale": (0.45, 0.68), "tz_shift": (0.1, 0.3), "lesion_semi_mm": (3.5, 9.0)}
ACQ = {"t2_inplane_mm": (1.1, 1.7), "t2_fov_mm": (120.0, 170.0), "t2_thickness_mm": (3.0, 4.5),
       "dwi_inplane_mm": (1.9, 2.8), "dwi_fov_mm": (170.0, 230.0), "dwi_thickness_mm": (3.5, 5.0),
       "tilt_deg": 12.0, "noise": (0.015, 0.05), "bias": (0.1, 0.5), "b_value": (800.0, 1500.0)}
T2 = {"pz": (0.55, 0.85), "tz": (0.28, 0.45), "lesion_ratio": (0.4, 0.58), "fat": (0.7, 0.95), "body": (0.3, 0.45),
      "muscle": (0.15, 0.25), "wall": (0.2, 0.3), "urine": (0.95, 1.1), "bone": (0.05, 0.15)}
ADC = {"pz": (1400.0, 1900.0), "tz": (1050.0, 1400.0), "lesion": (520.0, 820.0), "fat": (50.0, 200.0),
       "body": (1100.0, 1500.0), "muscle": (1300.0, 1600.0), "wall": (1200.0, 1500.0), "urine": (2700.0, 3100.0),
       "bone": (200.0, 400.0)}
PIRADS_RULE = ("PZ: ADC < 850 -> 5 if size >= 15 mm else 4, otherwise 3. TZ: T2 ratio (lesion / TZ) < 0.6 -> "
               "5 if size >= 15 mm else 4, otherwise 3. No lesion: 1.")


def real_harmonics(dirs: np.ndarray, coef: dict[tuple[int, int], float]) -> np.ndarray:
    """sum c_lm Y_lm(direction) over real (unnormalised) spherical harmonics; m < 0 is sin."""
    cos_t = np.clip(dirs[:, 2], -1, 1)
    phi = np.arctan2(dirs[:, 1], dirs[:, 0])
    out = np.zeros(len(dirs))
    for (l, m), c in coef.items():
        p = lpmv(abs(m), l, cos_t)
        p = p / max(np.abs(lpmv(abs(m), l, np.linspace(-1, 1, 201))).max(), 1e-9)
        out += c * p * (np.cos(m * phi) if m >= 0 else np.sin(-m * phi))
    return out


@dataclass(frozen=True)
class Blob:
    centre: np.ndarray
    frame: np.ndarray  # columns: the blob's axes in world
    semi: np.ndarray
    coef: dict[tuple[int, int], float]

    def inside(self, pts: np.ndarray) -> np.ndarray:
        q = ((pts - self.centre) @ self.frame) / self.semi
        r = np.linalg.norm(q, axis=1)
        reach = sum(abs(c) for c in self.coef.values())  # |sum c Y| <= sum |c| (each |Y| <= 1)
        out = r <= 1.0 - reach
        shell = (r > 1.0 - reach) & (r <= 1.0 + reach)  # only there does the surface's shape matter
        dirs = q[shell] / np.maximum(r[shell], 1e-9)[:, None]
        out[shell] = r[shell] <= 1.0 + real_harmonics(dirs, self.coef)
        return out


def _blob(rng: np.random.Generator, centre: np.ndarray, frame: np.ndarray, semi: np.ndarray) -> Blob:
    coef = {(l, m): float(rng.normal(0, SHAPE["harmonic_sd"] * 2 / l)) for l in (2, 3, 4) for m in range(-l, l + 1)}
    return Blob(centre, frame, semi, coef)


@dataclass(frozen=True)
class Pelvis:
    gland: Blob
    tz: Blob
    lesions: list[tuple[np.ndarray, np.ndarray, np.ndarray, str]]  # centre, frame, semi axes, zone
    body: tuple[float, float]
    fat: float

    def labels(self, pts: np.ndarray) -> np.ndarray:
        x, y, z = pts[:, 0], pts[:, 1], pts[:, 2]
        c = self.gland.centre
        out = np.zeros(len(pts), np.int16)
        ex, ey = self.body
        rho = (x / ex) ** 2 + (y / ey) ** 2
        out[rho <= 1] = FAT
        out[rho <= (1 - self.fat / ey) ** 2] = BODY
        for side in (-1, 1):  # obturator internus
            m = ((x - c[0] - side * 52) / 14) ** 2 + ((y - c[1]) / 30) ** 2 + ((z - c[2]) / 45) ** 2 <= 1
            out[m] = MUSCLE
        rect = ((x - c[0]) / 17) ** 2 + ((y - c[1] + 38) / 14) ** 2 <= 1
        out[rect] = WALL
        out[((x - c[0]) / 9) ** 2 + ((y - c[1] + 38) / 6) ** 2 <= 1] = AIR
        out[(((pts - (c + [0, 15, 50])) / [38, 32, 28]) ** 2).sum(1) <= 1] = URINE
        out[(((pts - (c + [0, 42, 10])) / [30, 7, 18]) ** 2).sum(1) <= 1] = BONE
        g = self.gland.inside(pts)
        out[g] = PZ
        out[g & self.tz.inside(pts)] = TZ
        for k, (lc, lf, ls, _) in enumerate(self.lesions):
            out[g & (((((pts - lc) @ lf) / ls) ** 2).sum(1) <= 1)] = LESION0 + k
        return out


def _pelvis(rng: np.random.Generator, n_lesions: int) -> Pelvis:
    centre = rng.normal(0, 6, 3)
    frame = rotation(rng, 12.0)
    semi = np.array([rng.uniform(*SHAPE["semi_lr_mm"]), rng.uniform(*SHAPE["semi_ap_mm"]),
                     rng.uniform(*SHAPE["semi_si_mm"])])
    gland = _blob(rng, centre, frame, semi)
    tz_c = centre + frame[:, 1] * semi[1] * rng.uniform(*SHAPE["tz_shift"])
    tz = _blob(rng, tz_c, frame, semi * rng.uniform(*SHAPE["tz_scale"]))
    lesions = []
    for k in range(n_lesions):
        zone = "PZ" if rng.random() < 0.65 else "TZ"
        side = rng.choice([-1.0, 1.0])
        if zone == "PZ":  # postero-lateral peripheral zone
            local = np.array([side * rng.uniform(0.35, 0.6), -rng.uniform(0.4, 0.65), rng.uniform(-0.4, 0.4)])
        else:
            local = np.array([side * rng.uniform(0.15, 0.35), 0.0, rng.uniform(-0.3, 0.3)]) * 1.0
            local = local * tz.semi / semi + (tz_c - centre) @ frame / semi
        lesions.append((centre + frame @ (local * semi), rotation(rng, 90.0),
                        rng.uniform(*SHAPE["lesion_semi_mm"], 3), zone))
    return Pelvis(gland, tz, lesions, (float(rng.uniform(150, 200)), float(rng.uniform(105, 140))),
                  float(rng.uniform(8, 25)))


def _grid(rng: np.random.Generator, centre: np.ndarray, inplane: tuple, fov: tuple, thick: tuple, axes: np.ndarray,
          extent_mm: float) -> tuple[Grid, float]:
    px, dz = rng.uniform(*inplane), rng.uniform(*thick)
    n = int(round(rng.uniform(*fov) / px))
    nz = int(np.ceil(extent_mm / dz))
    return centred_grid(axes, (px, px, dz), (n, int(n * rng.uniform(0.85, 1.0)), nz), centre), 1.0


def _u(rng: np.random.Generator, d: dict[str, tuple[float, float]]) -> dict[str, float]:
    return {k: float(rng.uniform(*v)) for k, v in d.items()}


def _lesion_truth(k: int, les: tuple, lab: np.ndarray, grid: Grid, img: np.ndarray, adc_lab: np.ndarray,
                  adc: dict[str, float], gland_x: float, t2: dict[str, float]) -> dict[str, Any] | None:
    m = lab == LESION0 + k
    if not m.any():
        return None
    pts = grid.points()[m.ravel()]
    zone = les[3]
    size = max_diameter_mm(m, grid.affine)
    ratio = t2["lesion_ratio"]  # lesion / its zone's T2 (the design: both tissues are uniform)
    cat = (5 if size >= 15 else 4) if (adc["lesion"] < 850 if zone == "PZ" else ratio < 0.6) else 3
    cw = pts.mean(axis=0)
    return {"id": k + 1, "label": k + 1, "zone": zone, "side": "R" if cw[0] > gland_x else "L",
            "size_mm": size, "volume_ml": float(m.sum() * grid.voxel_ml), "adc": adc["lesion"], "t2_ratio": ratio,
            "centroid_world": cw.tolist(), "box_voxel": voxel_box(m), "category": cat,
            "visible_on_adc_grid": bool((adc_lab == LESION0 + k).any())}


def make_gland_case(case_id: str, seed: int, n_lesions: int) -> Phantom:
    """One independent prostate case with ``n_lesions`` lesions (0-3)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x9A0D]))
    pel = _pelvis(rng, n_lesions)
    t2, adc = _u(rng, T2), _u(rng, ADC)
    axes = oriented(str(rng.choice(["ras", "lps"])), rng) @ np.eye(3)
    axes = rotation(rng, ACQ["tilt_deg"]) @ axes
    extent = 2 * pel.gland.semi.max() + rng.uniform(25, 45)
    g2, _ = _grid(rng, pel.gland.centre, ACQ["t2_inplane_mm"], ACQ["t2_fov_mm"], ACQ["t2_thickness_mm"], axes, extent)
    gd, _ = _grid(rng, pel.gland.centre + rng.normal(0, 4, 3), ACQ["dwi_inplane_mm"], ACQ["dwi_fov_mm"],
                  ACQ["dwi_thickness_mm"], axes, extent)
    lut_t2 = {0: 0.0, PZ: t2["pz"], TZ: t2["tz"], FAT: t2["fat"], BODY: t2["body"], MUSCLE: t2["muscle"],
              WALL: t2["wall"], AIR: 0.0, URINE: t2["urine"], BONE: t2["bone"]}
    lut_adc = {0: 0.0, PZ: adc["pz"], TZ: adc["tz"], FAT: adc["fat"], BODY: adc["body"], MUSCLE: adc["muscle"],
               WALL: adc["wall"], AIR: 0.0, URINE: adc["urine"], BONE: adc["bone"]}
    for k, les in enumerate(pel.lesions):
        lut_t2[LESION0 + k] = t2["lesion_ratio"] * (t2["pz"] if les[3] == "PZ" else t2["tz"])
        lut_adc[LESION0 + k] = adc["lesion"]
    noise, bias = rng.uniform(*ACQ["noise"]), rng.uniform(*ACQ["bias"])
    subs2, subsd = sample_labels(g2, pel.labels, 1.0), sample_labels(gd, pel.labels, 1.0)
    lab, adc_lab = subs2[1].astype(np.int16), subsd[1].astype(np.int16)
    img = acquire(g2, subs2, lut_t2, rng, bias, noise, float(rng.uniform(300, 3000)))
    adc_img = acquire(gd, subsd, lut_adc, rng, 0.0, noise * 0.5, 1.0)
    b = float(rng.uniform(*ACQ["b_value"]))
    s0 = {key: 1.0 for key in lut_adc}
    s0.update({0: 0.0, AIR: 0.0, FAT: 0.15, BONE: 0.2})
    dwi_lut = {key: s0[key] * np.exp(-b * v * 1e-6) for key, v in lut_adc.items()}
    dwi_img = acquire(gd, subsd, dwi_lut, rng, bias, noise, 1000.0)
    gland = (lab == PZ) | (lab == TZ) | (lab >= LESION0)
    gland_x = float(g2.points()[gland.ravel()].mean(axis=0)[0])
    lesions = [t for k, les in enumerate(pel.lesions)
               if (t := _lesion_truth(k, les, lab, g2, img, adc_lab, adc, gland_x, t2)) is not None]
    zones = np.where(lab == PZ, 1, np.where(lab == TZ, 2, 0))
    for k, les in enumerate(pel.lesions):  # a lesion belongs to its zone in the zone map
        zones[lab == LESION0 + k] = 1 if les[3] == "PZ" else 2
    les_map = np.where(lab >= LESION0, lab - LESION0 + 1, 0)
    truth = {"domain": "prostate", "family": "independent", "n_lesions": len(lesions), "lesions": lesions,
             "gland_volume_ml": float(gland.sum() * g2.voxel_ml), "pz_volume_ml": float((zones == 1).sum() * g2.voxel_ml),
             "tz_volume_ml": float((zones == 2).sum() * g2.voxel_ml),
             "max_category": max((les["category"] for les in lesions), default=1), "misalignment": None,
             "adc_units": "1e-6 mm2/s", "b_value": b, "pirads_rule": PIRADS_RULE, "gland_centroid_x_mm": gland_x}
    meta = {"age": int(rng.integers(50, 80)), "sex": "M", "psa_ng_ml": round(float(rng.uniform(3, 20)), 1),
            "b_value": b, "history": "elevated PSA; rule out clinically significant prostate cancer"}
    seqs = {"T2w": Image(img, g2.affine, {"sequence": "T2w", "series_description": "t2_tse_tra"}),
            "ADC": Image(adc_img.astype(np.float32), gd.affine, {"sequence": "ADC", "units": "1e-6 mm2/s",
                                                                "series_description": "ep2d_diff_ADC"}),
            "DWI": Image(dwi_img, gd.affine, {"sequence": "DWI", "b_value": b, "series_description": "ep2d_diff_TRACE"})}
    labels = {"zones": Mask(zones.astype(np.int16), g2.affine, labels={1: "PZ", 2: "TZ"}),
              "gland": Mask(gland.astype(np.int16), g2.affine, labels={1: "gland"}),
              "lesions": Mask(les_map.astype(np.int16), g2.affine,
                              labels={k + 1: f"lesion_{k + 1}" for k in range(len(pel.lesions))})}
    return Phantom(case_id, "prostate", seqs, labels, meta, truth)


__all__ = ["ACQ", "ADC", "PIRADS_RULE", "SHAPE", "T2", "make_gland_case", "real_harmonics"]
