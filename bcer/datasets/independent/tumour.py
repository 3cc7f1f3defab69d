"""Independent brain tumour cases: metaball tumours in an ellipsoid head, T1, T1c, T2, FLAIR.

Shape model (written apart from ``bcer.datasets.brain``): a head of nested ellipsoids
(scalp, skull, CSF, grey and white matter, two lateral ventricles); a tumour is a union of
random metaballs, field ``f(p) = sum exp(-|p - c_i|^2 / r_i^2)``: the whole tumour is
``f > 0.3``, the core the same balls at 55 % radius, the necrosis at 30 % (HGG); an LGG has
a non-enhancing core and no enhancement. Kinds: one focus on one side, two foci (same or
opposite sides), or a focus centred on the midline (butterfly). Image model: BraTS-like
affine ``diag(-s, -s, s)`` with origin (0, 239, 0) (the midline near world x = -120), RAS,
LPS, permuted and sagittal grids, skull-stripped or not. Truth: BraTS labels (1 necrotic /
non-enhancing core, 2 oedema, 4 enhancing), the whole tumour's side in the patient frame
relative to the head's midline (``right``/``left`` when >= 90 % lies on that side, else
``bilateral``), the right share, and the number of foci (26-connected, >= 0.5 mL).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import ndimage

from ...contracts.artifacts import Image, Mask
from ..phantom import Phantom
from .acquire import Grid, acquire, centred_grid, oriented, sample_labels

NCR, OED, ET = 1, 2, 4  # BraTS 2021 labels
SCALP, SKULL, CSF, GM, WM, VENT = 5, 6, 7, 8, 9, 10
KINDS = ("single", "multifocal", "midline")

# Ranges of the independent family. FIXED BEFORE ANY SCORE WAS LOOKED AT; they must not be
# changed after seeing a score (a change that raises a score by narrowing a range is a defect).
HEAD = {"semi_lr_mm": (66.0, 76.0), "semi_ap_mm": (84.0, 96.0), "semi_si_mm": (60.0, 70.0), "yaw_deg": 5.0}
TUMOUR = {"balls": (2, 5), "ball_r_mm": (9.0, 18.0), "spread_mm": (4.0, 12.0), "lateral_mm": (25.0, 45.0)}
ACQ = {"spacing_mm": (2.0, 3.0), "orientations": ("brats", "brats", "ras", "lps", "permuted", "sagittal"),
       "noise": (0.01, 0.05), "bias": (0.05, 0.35), "skull_stripped_p": 0.5}
CONTRAST = {  # tissue -> (T1, T1c, T2, FLAIR) ranges
    "wm": ((0.7, 0.85), (0.7, 0.85), (0.3, 0.4), (0.35, 0.45)),
    "gm": ((0.45, 0.6), (0.45, 0.6), (0.45, 0.55), (0.45, 0.55)),
    "csf": ((0.08, 0.18), (0.08, 0.18), (0.9, 1.0), (0.05, 0.15)),
    "oedema": ((0.35, 0.45), (0.35, 0.45), (0.7, 0.85), (0.8, 1.0)),
    "necrosis": ((0.12, 0.25), (0.12, 0.25), (0.85, 0.95), (0.4, 0.6)),
    "enhancing": ((0.38, 0.48), (0.95, 1.2), (0.55, 0.7), (0.65, 0.8)),
    "ne_core": ((0.3, 0.4), (0.3, 0.4), (0.75, 0.9), (0.7, 0.9)),
    "skull": ((0.05, 0.15), (0.05, 0.15), (0.05, 0.12), (0.05, 0.12)),
    "scalp": ((0.6, 0.9), (0.6, 0.9), (0.4, 0.6), (0.5, 0.7)),
}
SEQS = ("T1", "T1c", "T2", "FLAIR")


@dataclass(frozen=True)
class Head:
    centre: np.ndarray
    frame: np.ndarray  # columns: the head's left-right, posterior-anterior, inferior-superior axes
    semi: np.ndarray
    balls: list[tuple[np.ndarray, float]]  # head-frame centre, radius
    grade: str

    def local(self, pts: np.ndarray) -> np.ndarray:
        return (pts - self.centre) @ self.frame

    def labels(self, pts: np.ndarray) -> np.ndarray:
        q = self.local(pts)
        out = np.zeros(len(q), np.int16)
        r = np.sqrt(((q / self.semi) ** 2).sum(1))
        for lim, lab in ((1.0, SCALP), (0.95, SKULL), (0.9, CSF), (0.87, GM), (0.72, WM)):
            out[r <= lim] = lab
        for side in (-1, 1):
            v = ((q[:, 0] - side * 9) / 6) ** 2 + ((q[:, 1] - 5) / 28) ** 2 + ((q[:, 2] - 8) / 10) ** 2 <= 1
            out[v] = VENT
        brain = r <= 0.87
        wt, core, nec = (self._field(q, s) > 0.3 for s in (1.0, 0.55, 0.3))
        out[brain & wt] = OED
        out[brain & core] = ET if self.grade == "HGG" else NCR
        if self.grade == "HGG":
            out[brain & nec] = NCR
        return out

    def _field(self, q: np.ndarray, scale: float) -> np.ndarray:
        f = np.zeros(len(q))
        for c, rad in self.balls:
            f += np.exp(-((q - c) ** 2).sum(1) / (rad * scale) ** 2)
        return f


def _cluster(rng: np.random.Generator, centre: np.ndarray) -> list[tuple[np.ndarray, float]]:
    n = int(rng.integers(TUMOUR["balls"][0], TUMOUR["balls"][1] + 1))
    return [(centre + rng.normal(0, rng.uniform(*TUMOUR["spread_mm"]), 3), float(rng.uniform(*TUMOUR["ball_r_mm"])))
            for _ in range(n)]


def _site(rng: np.random.Generator, side: float) -> np.ndarray:
    return np.array([side * rng.uniform(*TUMOUR["lateral_mm"]), rng.uniform(-40, 40), rng.uniform(-10, 30)])


def _balls(rng: np.random.Generator, kind: str, side: str) -> list[tuple[np.ndarray, float]]:
    s = 1.0 if side == "right" else -1.0  # RAS: +x is the patient's right
    if kind == "single":
        return _cluster(rng, _site(rng, s))
    if kind == "midline":  # butterfly across the corpus callosum
        c = np.array([0.0, rng.uniform(-25, 25), rng.uniform(15, 25)])
        return _cluster(rng, c + [-12, 0, 0]) + _cluster(rng, c + [12, 0, 0])
    first = _site(rng, s)
    second = _site(rng, s if rng.random() < 0.5 else -s)
    while np.linalg.norm(second - first) < 55:  # separate foci, not one lobulated tumour
        second = _site(rng, -s)
    return [(c, r * 0.8) for c, r in _cluster(rng, first) + _cluster(rng, second)]


def _grid(rng: np.random.Generator, orient: str, head_centre: np.ndarray) -> tuple[Grid, np.ndarray]:
    """The grid, and the world position of the head centre (BraTS: the midline near x = -120)."""
    sp = float(rng.uniform(*ACQ["spacing_mm"]))
    if orient == "brats":
        shape = (int(240 / sp), int(240 / sp), int(155 / sp))
        aff = np.diag([-sp, -sp, sp, 1.0])
        aff[:3, 3] = [0.0, 239.0, 0.0]
        return Grid(shape, aff), np.array([-120.0, 119.0, 77.0]) + rng.normal(0, 3, 3)
    axes = oriented(orient, rng)
    n = int(np.ceil(200 / sp))
    return centred_grid(axes, (sp, sp, sp), (n, n, n), head_centre + rng.normal(0, 6, 3)), head_centre


def _truth(head: Head, grid: Grid, lab: np.ndarray) -> dict[str, Any]:
    wt = np.isin(lab, (NCR, OED, ET))
    x = head.local(grid.points()[wt.ravel()])[:, 0]
    right = float((x > 0).mean()) if len(x) else 0.0
    side = "right" if right >= 0.9 else "left" if right <= 0.1 else "bilateral"
    comp, _ = ndimage.label(wt, structure=np.ones((3, 3, 3)))
    sizes = np.bincount(comp.ravel())[1:] * grid.voxel_ml
    vols = {str(k): float((lab == k).sum() * grid.voxel_ml) for k in (NCR, OED, ET)}
    return {"grade": head.grade, "side": side, "right_share": right, "n_foci": int((sizes >= 0.5).sum()),
            "multifocal": bool((sizes >= 0.5).sum() >= 2), "volumes_ml": vols, "WT_ml": float(wt.sum() * grid.voxel_ml),
            "TC_ml": vols["1"] + vols["4"], "ET_ml": vols["4"], "voxel_ml": grid.voxel_ml, "family": "independent"}


def make_tumour_case(case_id: str, seed: int, kind: str, side: str = "right", grade: str = "HGG",
                     orientation: str | None = None) -> Phantom:
    """One independent brain tumour case: ``kind`` in KINDS, ``side`` of the (first) focus;
    ``orientation`` (one of ``ACQ["orientations"]``) overrides the seeded draw."""
    if kind not in KINDS or side not in ("left", "right") or grade not in ("HGG", "LGG"):
        raise ValueError(f"bad tumour design {kind!r}, {side!r}, {grade!r}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB7A1]))
    semi = np.array([rng.uniform(*HEAD[k]) for k in ("semi_lr_mm", "semi_ap_mm", "semi_si_mm")])
    orient = str(rng.choice(ACQ["orientations"]))
    orient = orientation or orient  # the draw is made either way: the seed stream stays in step
    grid, centre = _grid(rng, orient, rng.normal(0, 20, 3))
    yaw = np.deg2rad(rng.uniform(-HEAD["yaw_deg"], HEAD["yaw_deg"]))
    frame = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
    head = Head(centre, frame, semi, _balls(rng, kind, side), grade)
    stripped = rng.random() < ACQ["skull_stripped_p"]
    noise, bias = float(rng.uniform(*ACQ["noise"])), float(rng.uniform(*ACQ["bias"]))
    keys = {"wm": WM, "gm": GM, "csf": CSF, "skull": SKULL, "scalp": SCALP}
    subs = sample_labels(grid, head.labels, 1.0)  # one anatomy, four contrasts
    lab = subs[1]
    seqs = {}
    for i, seq in enumerate(SEQS):
        lut = {0: 0.0, VENT: 0.0}
        for tissue, lb in keys.items():
            lut[lb] = float(rng.uniform(*CONTRAST[tissue][i]))
        lut[VENT] = lut[CSF]
        lut[OED] = float(rng.uniform(*CONTRAST["oedema"][i]))
        lut[NCR] = float(rng.uniform(*CONTRAST["necrosis" if grade == "HGG" else "ne_core"][i]))
        lut[ET] = float(rng.uniform(*CONTRAST["enhancing"][i]))
        if stripped:
            lut[SCALP] = lut[SKULL] = 0.0
        img = acquire(grid, subs, lut, rng, bias, noise, float(rng.uniform(200, 2000)))
        if stripped:
            img[~np.isin(lab, (GM, WM, CSF, VENT, NCR, OED, ET))] = 0.0
        seqs[seq] = Image(img, grid.affine, {"sequence": seq})
    seg = np.where(np.isin(lab, (NCR, OED, ET)), lab, 0).astype(np.int16)
    brain = np.isin(lab, (GM, WM, VENT, NCR, OED, ET)).astype(np.int16)
    truth = _truth(head, grid, seg)
    truth.update(kind=kind, designed_side=side, orientation=orient, skull_stripped=stripped,
                 spacing_mm=float(np.linalg.norm(grid.affine[:3, 0])), midline_world_x=float(centre[0]))
    labels = {"seg": Mask(seg, grid.affine, {"case": case_id}, labels={1: "necrotic_core", 2: "oedema", 4: "enhancing"}),
              "brain": Mask(brain, grid.affine, {"case": case_id}, labels={1: "brain"})}
    meta = {"age": int(rng.integers(25, 80)), "sex": str(rng.choice(["F", "M"]))}
    return Phantom(case_id, "brain", seqs, labels, meta, truth)


__all__ = ["ACQ", "CONTRAST", "HEAD", "KINDS", "TUMOUR", "make_tumour_case"]
