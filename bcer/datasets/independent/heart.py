"""Independent cardiac cines: a half-ellipsoid shell heart with its own contraction model.

Shape model (written apart from ``bcer.datasets.cardiac``): in a heart frame (u, v across,
w along the long axis, base plane at w = 0, apex at w < 0) the LV cavity is a half prolate
ellipsoid, the myocardium the shell between it and a second half ellipsoid, and the RV
cavity a half ellipsoid beside the septum minus the LV epicardium. Contraction: the cavity's
short axes shrink by ``ra`` and its long axis by ``rc`` at end-systole, the myocardial volume
is conserved (the wall thickens), and an infarct is a sector of the wall that neither moves
nor thickens and is thinner. The frame state follows a two-phase curve of its own: a sine
ejection to ES, then rapid filling, diastasis and an atrial kick. The cine is a short-axis
stack (slices across the long axis, tilted up to 10 degrees) of thick slices with gaps,
with lungs, liver and a fat-walled body around the heart.

Truth is measured on the label maps written (ED/ES are the frames of largest and smallest LV
cavity); the ACDC group is the ACDC criteria applied to the true values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...contracts.artifacts import Cine, Mask
from ..phantom import Phantom
from .acquire import Grid, centred_grid, cosine_bias, render, rician, rotation

RV, MYO, LV, BODY, LUNG, LIVER, FAT = 1, 2, 3, 4, 5, 6, 7
GROUPS = ("NOR", "DCM", "HCM", "MINF", "RV")
_ATTEMPTS = 8

# Ranges of the independent family. FIXED BEFORE ANY SCORE WAS LOOKED AT; they must not be
# changed after seeing a score (a change that raises a score by narrowing a range is a defect).
DESIGN: dict[str, dict[str, tuple[float, float]]] = {  # group -> LV EDV mL, LVEF %, ED wall mm, RV EDV mL, RVEF %
    "NOR": {"edv": (115, 175), "ef": (56, 68), "wall": (7.5, 10.5), "rv_edv": (110, 170), "rv_ef": (48, 62)},
    "DCM": {"edv": (240, 330), "ef": (14, 34), "wall": (6.0, 8.5), "rv_edv": (120, 190), "rv_ef": (35, 55)},
    "HCM": {"edv": (95, 145), "ef": (64, 78), "wall": (16.0, 22.0), "rv_edv": (90, 140), "rv_ef": (50, 65)},
    "MINF": {"edv": (140, 185), "ef": (22, 37), "wall": (8.0, 10.5), "rv_edv": (110, 160), "rv_ef": (42, 58)},
    "RV": {"edv": (110, 160), "ef": (55, 66), "wall": (7.5, 10.0), "rv_edv": (230, 300), "rv_ef": (22, 36)},
}
ACQ = {"frames": (10, 16), "inplane_mm": (2.1, 3.0), "fov_mm": (210.0, 280.0), "thickness_mm": (6.0, 10.0),
       "gap_mm": (0.0, 3.0), "tilt_deg": 10.0, "noise": (0.02, 0.06), "bias": (0.1, 0.45),
       "es_phase": (0.30, 0.42), "trigger_frames": (0.0, 1.5), "height_cm": (155.0, 195.0),
       "weight_kg": (52.0, 105.0), "akinetic_sector_deg": (70.0, 110.0)}
CONTRAST = {"blood": (0.75, 1.0), "myo": (0.15, 0.32), "body": (0.28, 0.5), "lung": (0.02, 0.08),
            "liver": (0.22, 0.4), "fat": (0.6, 0.9)}


def _u(rng: np.random.Generator, lohi: tuple[float, float]) -> float:
    return float(rng.uniform(*lohi))


def cycle_state(n_frames: int, es_phase: float, trigger: float, rng: np.random.Generator) -> np.ndarray:
    """Contraction per frame, 0 at end-diastole and 1 at end-systole: a sine ejection to
    ``es_phase`` of the cycle, rapid filling to 70-80 %, a slow diastasis, and an atrial kick
    over the last 12-18 % of the cycle. ``trigger`` (frames) delays the first frame."""
    phi = ((np.arange(n_frames) + trigger) / n_frames) % 1.0
    fill_end = es_phase + rng.uniform(0.15, 0.22)
    kick = 1.0 - rng.uniform(0.12, 0.18)
    level = rng.uniform(0.15, 0.3)  # contraction left after rapid filling
    out = np.empty(n_frames)
    for i, p in enumerate(phi):
        if p <= es_phase:
            out[i] = np.sin(0.5 * np.pi * p / es_phase) ** 2
        elif p <= fill_end:
            x = (p - es_phase) / (fill_end - es_phase)
            out[i] = level + (1 - level) * (1 - x) ** 2
        elif p <= kick:
            out[i] = level * (1 - 0.3 * (p - fill_end) / (kick - fill_end))
        else:
            out[i] = 0.7 * level * (1 - (p - kick) / (1 - kick))
    return out


@dataclass(frozen=True)
class Heart:
    """ED geometry in the heart frame (mm) and the contraction parameters."""

    origin: np.ndarray  # world point of the base centre
    frame: np.ndarray  # columns u, v, w (w: apex -> base)
    a: float  # LV cavity short semi-axis at ED
    c: float  # LV cavity long semi-axis (base to apex) at ED
    wall: float
    ra: float  # cavity short-axis ratio ES/ED
    rc: float  # cavity long-axis ratio ES/ED
    rv: tuple[float, float, float]  # RV semi-axes (toward septum, across, long)
    rr: float  # RV short-axis ratio ES/ED
    sector: tuple[float, float] | None  # akinetic sector (start, width) in radians

    def anatomy(self, s: float, world: Surroundings):
        """The label function at contraction state ``s`` (0 ED, 1 ES)."""
        a_s, c_s = self.a * (1 - s * (1 - self.ra)), self.c * (1 - s * (1 - self.rc))
        ao, co = self.a + self.wall, self.c + self.wall * 1.1
        v_myo = ao * ao * co - self.a * self.a * self.c
        co_s = co - (self.c - c_s)
        ao_s = np.sqrt((v_myo + a_s * a_s * c_s) / co_s)
        bu, bv, bw = self.rv
        k = 1 - s * (1 - self.rr)

        def labels(pts: np.ndarray) -> np.ndarray:
            out = world.labels(pts)
            q = (pts - self.origin) @ self.frame
            u, v, w = q[:, 0], q[:, 1], q[:, 2]
            r2 = u * u + v * v
            a_in, a_out = np.full(len(q), a_s), np.full(len(q), ao_s)
            if self.sector is not None:  # akinetic and thinned: stays at its ED cavity radius
                ang = (np.arctan2(v, u) - self.sector[0]) % (2 * np.pi)
                inside = ang < self.sector[1]
                a_in[inside], a_out[inside] = self.a, self.a + 0.6 * self.wall
            below = w <= 0
            endo = below & (r2 / a_in ** 2 + (w / c_s) ** 2 <= 1)
            epi = below & (r2 / a_out ** 2 + (w / co_s) ** 2 <= 1)
            du = u - (ao + bu * 0.3)  # beside the septum: the epicardium bites a crescent out of it
            rvc = below & ((du / (bu * k)) ** 2 + (v / (bv * k)) ** 2 + (w / bw) ** 2 <= 1) & ~epi
            out[rvc] = RV
            out[epi & ~endo] = MYO
            out[endo] = LV
            return out
        return labels


@dataclass(frozen=True)
class Surroundings:
    """Body (elliptic cylinder with a fat rim), two lungs and a liver, in world mm."""

    body: tuple[float, float]
    fat: float
    lungs: tuple[np.ndarray, np.ndarray, np.ndarray]  # centre L, centre R, semi-axes
    liver: tuple[np.ndarray, np.ndarray]

    def labels(self, pts: np.ndarray) -> np.ndarray:
        x, y = pts[:, 0], pts[:, 1]
        out = np.zeros(len(pts), np.int16)
        ex, ey = self.body
        rho = (x / ex) ** 2 + (y / ey) ** 2
        out[rho <= 1] = FAT
        out[rho <= (1 - self.fat / ey) ** 2] = BODY
        cl, cr, ax = self.lungs
        for c in (cl, cr):
            out[(((pts - c) / ax) ** 2).sum(1) <= 1] = LUNG
        lc, lax = self.liver
        out[(((pts - lc) / lax) ** 2).sum(1) <= 1] = LIVER
        return out


def acdc_group(v: dict[str, float], abnormal_segments: int) -> str:
    """The ACDC criteria (Bernard et al. 2018) in the usual order, on true values."""
    if v["lv_ef_pct"] > 55 and (v["max_wall_thickness_mm"] >= 15 or v["lv_mass_index_g_m2"] >= 110):
        return "HCM"
    if v["lv_ef_pct"] < 40:
        if abnormal_segments >= 2:
            return "MINF"
        return "DCM" if v["lv_edvi_ml_m2"] > 100 else "MINF"
    if v["rv_edvi_ml_m2"] > 110 or v["rv_ef_pct"] < 40:
        return "RV"
    return "NOR"


def _heart(rng: np.random.Generator, group: str) -> Heart:
    d = DESIGN[group]
    edv, ef, wall = _u(rng, d["edv"]), _u(rng, d["ef"]) / 100, _u(rng, d["wall"])
    ratio = rng.uniform(1.5, 2.1)  # long / short semi-axis of the cavity
    a = (3 * edv * 1000 / (2 * np.pi * ratio)) ** (1 / 3)
    rc = rng.uniform(0.82, 0.94)
    ra = float(np.sqrt(max(1 - ef, 0.05) / rc))
    rv_edv, rv_ef = _u(rng, d["rv_edv"]), _u(rng, d["rv_ef"]) / 100
    bw = a * ratio * rng.uniform(0.85, 1.0)
    bv = rng.uniform(1.5, 1.9) * a
    bu = 3 * rv_edv * 1000 / (2 * np.pi * bv * bw) * rng.uniform(1.15, 1.3)  # the LV takes a bite out of it
    rr = float(np.sqrt(max(1 - rv_ef, 0.05)))
    w = np.array([0.55, -0.45, 0.7]) + rng.normal(0, 0.12, 3)  # apex -> base: apex left, anterior, inferior
    w /= np.linalg.norm(w)
    sept = np.array([0.6, 0.8, 0.0]) - w * (w @ np.array([0.6, 0.8, 0.0]))  # toward the RV: right-anterior
    sept /= np.linalg.norm(sept)
    frame = np.stack([sept, np.cross(w, sept), w], 1)
    origin = np.array([rng.uniform(-15, 15), rng.uniform(-10, 20), rng.uniform(-10, 10)])
    sector = None
    if group == "MINF":
        sector = (float(rng.uniform(0, 2 * np.pi)), float(np.deg2rad(_u(rng, ACQ["akinetic_sector_deg"]))))
    return Heart(origin, frame, float(a), float(a * ratio), wall, ra, float(rc), (float(bu), float(bv), float(bw)),
                 rr, sector)


def _surroundings(rng: np.random.Generator, heart: Heart) -> Surroundings:
    ex, ey = rng.uniform(150, 190), rng.uniform(105, 135)
    lung_ax = np.array([rng.uniform(45, 60), rng.uniform(60, 80), rng.uniform(90, 120)])
    cl = np.array([-(heart.a + 75), -5.0, 30.0]) + rng.normal(0, 5, 3)
    cr = np.array([95.0, -5.0, 35.0]) + rng.normal(0, 5, 3)
    liver = (np.array([60.0, 0.0, -110.0]) + rng.normal(0, 8, 3),
             np.array([rng.uniform(90, 120), rng.uniform(70, 90), rng.uniform(55, 75)]))
    return Surroundings((float(ex), float(ey)), float(rng.uniform(6, 18)), (cl, cr, lung_ax), liver)


def _stack(rng: np.random.Generator, heart: Heart) -> tuple[Grid, float]:
    """The short-axis grid (slices across the tilted long axis) and the slice thickness in voxels."""
    tilt = rotation(rng, ACQ["tilt_deg"])
    spin = rng.uniform(0, 2 * np.pi)
    axes = heart.frame @ np.array([[np.cos(spin), -np.sin(spin), 0], [np.sin(spin), np.cos(spin), 0], [0, 0, 1]])
    axes = tilt @ axes
    axes = axes * np.array([1.0, 1.0, -1.0])[None, :]  # slice 0 at the base, as most scanners store a stack
    px, thick, gap = _u(rng, ACQ["inplane_mm"]), _u(rng, ACQ["thickness_mm"]), _u(rng, ACQ["gap_mm"])
    dz = thick + gap
    length = heart.c + heart.wall * 1.1
    n_z = int(np.ceil((length + rng.uniform(8, 20)) / dz)) + 1
    n_xy = int(round(_u(rng, ACQ["fov_mm"]) / px))
    centre = heart.origin + heart.frame[:, 2] * (-length / 2 + rng.uniform(-3, 3))
    centre = centre + heart.frame[:, :2] @ rng.normal(0, 8, 2)  # the heart is not in the middle of the image
    ratio = rng.uniform(0.8, 1.0)
    grid = centred_grid(axes, (px, px, dz), (n_xy, int(n_xy * ratio), n_z), centre)
    return grid, thick / dz


def _volumes(seg: np.ndarray, voxel_ml: float) -> dict[str, np.ndarray]:
    return {k: np.count_nonzero(seg == lab, axis=(0, 1, 2)) * voxel_ml for k, lab in (("lv", LV), ("rv", RV),
                                                                                      ("myo", MYO))}


def _truth(seg: np.ndarray, grid: Grid, heart: Heart, height: float, weight: float) -> dict[str, Any]:
    vol = _volumes(seg, grid.voxel_ml)
    ed, es = int(np.argmax(vol["lv"])), int(np.argmin(vol["lv"]))
    bsa = float(np.sqrt(height * weight / 3600.0))
    lv_ed, lv_es, rv_ed, rv_es = vol["lv"][ed], vol["lv"][es], vol["rv"][ed], vol["rv"][es]
    t = {"ed_frame": ed, "es_frame": es, "n_frames": int(seg.shape[3]),
         "lv_edv_ml": float(lv_ed), "lv_esv_ml": float(lv_es), "lv_ef_pct": float(100 * (lv_ed - lv_es) / lv_ed),
         "rv_edv_ml": float(rv_ed), "rv_esv_ml": float(rv_es), "rv_ef_pct": float(100 * (rv_ed - rv_es) / rv_ed),
         "myo_volume_ml": float(vol["myo"][ed]), "myo_mass_g": float(1.05 * vol["myo"][ed]),
         "max_wall_thickness_mm": float(heart.wall), "height_cm": height, "weight_kg": weight, "bsa_m2": bsa,
         "lv_volume_curve_ml": vol["lv"].tolist(), "rv_volume_curve_ml": vol["rv"].tolist()}
    t.update(lv_edvi_ml_m2=t["lv_edv_ml"] / bsa, rv_edvi_ml_m2=t["rv_edv_ml"] / bsa,
             lv_mass_index_g_m2=t["myo_mass_g"] / bsa)
    abnormal = 0 if heart.sector is None else int(round(np.rad2deg(heart.sector[1]) / 60.0 * 2))  # 6 per ring
    t["group"] = acdc_group(t, abnormal)
    return t


def make_heart_case(case_id: str, seed: int, group: str) -> Phantom:
    """One independent short-axis cine of a heart designed as ``group``. The truth ``group`` is
    the ACDC criteria applied to the measured truth; a draw whose measured truth falls in
    another group is drawn again from the same seeded stream (at most ``_ATTEMPTS`` times;
    the last draw is kept and its ``designed_as`` says what was meant)."""
    if group not in DESIGN:
        raise ValueError(f"group must be one of {GROUPS}, got {group!r}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA7D]))
    for _ in range(_ATTEMPTS):
        ph = _draw(case_id, rng, group)
        if ph.truth["group"] == group:
            break
    return ph


def _draw(case_id: str, rng: np.random.Generator, group: str) -> Phantom:
    heart = _heart(rng, group)
    world = _surroundings(rng, heart)
    grid, thick = _stack(rng, heart)
    n_frames = int(rng.integers(ACQ["frames"][0], ACQ["frames"][1] + 1))
    states = cycle_state(n_frames, _u(rng, ACQ["es_phase"]), _u(rng, ACQ["trigger_frames"]), rng)
    con = {k: _u(rng, v) for k, v in CONTRAST.items()}
    lut = {0: 0.0, RV: con["blood"], LV: con["blood"], MYO: con["myo"], BODY: con["body"], LUNG: con["lung"],
           LIVER: con["liver"], FAT: con["fat"]}
    bias = cosine_bias(grid, rng, _u(rng, ACQ["bias"]), 300.0)
    noise, scale = _u(rng, ACQ["noise"]), float(rng.uniform(200, 4000))
    frames, segs = [], []
    for s in states:
        img, lab = render(grid, heart.anatomy(float(s), world), lut, thick)
        frames.append(rician(img * bias, rng, noise * con["blood"]) * scale)
        segs.append(np.where(lab <= LV, lab, 0))
    seg = np.stack(segs, -1).astype(np.int16)
    height, weight = round(_u(rng, ACQ["height_cm"])), round(_u(rng, ACQ["weight_kg"]))
    truth = _truth(seg, grid, heart, float(height), float(weight))
    truth.update(designed_as=group, family="independent", akinetic=heart.sector is not None,
                 acquisition={"spacing_mm": grid.spacing.round(2).tolist(), "thickness_mm": round(thick * grid.spacing[2], 2),
                              "matrix": list(grid.shape), "n_frames": n_frames, "noise": round(noise, 3)})
    cine = Cine(np.stack(frames, -1).astype(np.float32), grid.affine, {"case_id": case_id, "sequence": "bSSFP cine"})
    mask = Mask(seg, grid.affine, {"case_id": case_id}, labels={RV: "RV", MYO: "MYO", LV: "LV"})
    return Phantom(case_id, "cardiac", {"CINE": cine}, {"seg": mask}, {"height": height, "weight": weight}, truth)


__all__ = ["ACQ", "CONTRAST", "DESIGN", "GROUPS", "acdc_group", "cycle_state", "make_heart_case"]
