"""The randomised and held-out cardiac cine families (ranges: ``cardiac.FAMILY_RANGES``).

The heart model (LV, myocardium, RV, akinesia) is ``bcer.datasets.cardiac``'s; this module
draws everything else from a family's ranges: the acquisition (field of view, matrix,
in-plane rotation, flips and obliquity of the stack, slices beyond base and apex, slice
order, trigger delay, frame count, coil shading, noise, intensity scale), the shape of the
volume curve, and anatomy around the heart (left atrium, liver, pericardial fat). Truth is
measured on the sampled label maps exactly as for the base family.

A family case is accepted only when its measured truth meets its own ACDC group's criteria
and no other (and, when ``borderline``, lies near a threshold); otherwise the anatomy is
drawn again from the same seeded stream, so a seed always gives the same case.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
from scipy import ndimage
from scipy.spatial.transform import Rotation

from ..contracts.artifacts import Cine, Mask
from ..contracts.errors import ErrorCode, ToolError
from . import cardiac as C
from .generators import register_family_builder
from .degrade import bias_field, rician_noise
from .geometry import make_affine, random_direction, world_coords
from .phantom import Phantom, Size

log = logging.getLogger(__name__)

_MAX_ATTEMPTS = 25
_FAMILY_SALT = {"randomised": 0x7A, "heldout": 0x4E1D}


def contraction(n_frames: int, offset: float, es_phase: float, model: str, rng: np.random.Generator) -> np.ndarray:
    """Contraction state per frame (0 at end-diastole, 1 at end-systole) for a volume-curve model.

    ``offset`` is the trigger delay in frames (ED at a fractional frame position). Models:
    ``cosine`` (the base family's), ``skewed`` (power-shaped ejection and filling), and
    ``physiological``: ejection, isovolumic relaxation (slight relaxation), rapid filling,
    diastasis and atrial kick. Every model has a single maximum (ES) and minimum (ED) state.
    """
    phi = ((np.arange(n_frames) - offset) % n_frames) / n_frames
    t = np.minimum(phi / es_phase, 1.0)
    sys = 0.5 * (1 - np.cos(np.pi * t))
    d = np.clip((phi - es_phase) / (1 - es_phase), 0, 1)
    if model == "cosine":
        return np.where(phi <= es_phase, sys, 0.5 * (1 + np.cos(np.pi * d)))
    if model == "skewed":
        g, k = rng.uniform(0.7, 1.4), rng.uniform(0.6, 1.4)
        return np.where(phi <= es_phase, sys ** g, 0.5 * (1 + np.cos(np.pi * d ** k)))
    if model != "physiological":
        raise ToolError(ErrorCode.value_range, f"unknown volume-curve model {model!r}", arg="curve")
    ivr, fill = rng.uniform(0.04, 0.08), rng.uniform(0.14, 0.2)
    d1 = rng.uniform(0.2, 0.32)
    d2, kick = d1 - rng.uniform(0.03, 0.08), rng.uniform(0.1, 0.15)
    a, b, e = es_phase + ivr, es_phase + ivr + fill, 1.0 - kick
    c = np.empty_like(phi)
    for i, x in enumerate(phi):
        if x <= es_phase:
            c[i] = sys[i]
        elif x <= a:  # isovolumic relaxation: the cavity barely changes
            c[i] = 1.0 - 0.03 * (x - es_phase) / ivr
        elif x <= b:  # rapid filling
            c[i] = d1 + (0.97 - d1) * 0.5 * (1 + np.cos(np.pi * (x - a) / fill))
        elif x <= e:  # diastasis
            c[i] = d1 + (d2 - d1) * (x - b) / max(e - b, 1e-6)
        else:  # atrial kick fills the ventricle to its end-diastolic volume
            c[i] = d2 * 0.5 * (1 + np.cos(np.pi * (x - e) / kick))
    return c


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _heart_frame(rng: np.random.Generator, fam: C.FamilyRanges) -> tuple[np.ndarray, np.ndarray]:
    w = np.array([-0.55, 0.45, -0.7]) + rng.normal(0, fam.axis_jitter, 3)
    w /= np.linalg.norm(w)
    sept = np.array([1.0, 0.6, 0.0])
    u = sept - (sept @ w) * w
    u /= np.linalg.norm(u)
    return np.stack([u, np.cross(w, u), w], axis=1), np.array([-10.0, 10.0, 15.0]) + rng.normal(0, 6, 3)


def _stack(size: Size, rng: np.random.Generator, fam: C.FamilyRanges, frame: np.ndarray, p: dict[str, Any]
           ) -> dict[str, Any]:
    """Acquisition geometry draws (no world position yet): spacing, matrix, slices, axes."""
    sp, dz = rng.uniform(*fam.spacing_mm[size]), rng.uniform(*fam.slice_mm[size])
    n_frames = int(rng.integers(fam.frames[size][0], fam.frames[size][1] + 1))
    nx = 2 * int(round(rng.uniform(*fam.fov_mm) / sp / 2))
    ny = 2 * int(round(nx * rng.uniform(*fam.aspect) / 2))
    heart = p["L0"] + p["wall"]
    top, bottom = (int(rng.integers(fam.extra_slices[0], fam.extra_slices[1] + 1)) for _ in range(2))
    w0 = -rng.uniform(0.2, 0.8) * dz - top * dz  # first slice centre on the long axis (base plane: w = 0)
    nz = int(np.ceil((heart + 0.3 * dz - w0) / dz)) + 1 + bottom
    spin = Rotation.from_rotvec([0.0, 0.0, rng.uniform(0, 2 * np.pi)]).as_matrix()  # RV anywhere in-plane
    tilt = random_direction(rng, oblique_deg=rng.uniform(*fam.oblique_deg), flips=False)
    apex_first = bool(rng.random() < fam.apex_first)
    signs = np.array([-1.0 if rng.random() < fam.flip else 1.0, -1.0 if rng.random() < fam.flip else 1.0,
                      -1.0 if apex_first else 1.0])
    offset = rng.uniform(*fam.heart_offset_mm)
    return {"spacing": (sp, sp, dz), "shape": (nx, ny, nz), "n_frames": n_frames,
            "direction": (frame @ tilt @ spin) * signs[None, :], "w_mid": w0 + (nz - 1) / 2 * dz,
            "apex_first": apex_first, "offset_mm": offset, "offset_angle": rng.uniform(0, 2 * np.pi),
            "extra_slices": [top, bottom]}


def _affine(st: dict[str, Any], frame: np.ndarray, base: np.ndarray, p: dict[str, Any], shrink: float) -> np.ndarray:
    u, v, w = frame[:, 0], frame[:, 1], frame[:, 2]
    off = shrink * st["offset_mm"] * (np.cos(st["offset_angle"]) * u + np.sin(st["offset_angle"]) * v)
    centre = base + w * st["w_mid"] + u * 0.3 * p["a0"] * p["rv_scale"] + off
    return make_affine(st["direction"], st["spacing"], st["shape"], centre)


def _extras(rng: np.random.Generator, fam: C.FamilyRanges, p: dict[str, Any]) -> dict[str, Any]:
    """Anatomy around the heart: left atrium (heart frame), pericardial fat, liver."""
    la = None
    if rng.random() < fam.atrium:
        la = {"u": -rng.uniform(0.0, 0.4) * p["a0"], "v": rng.uniform(-0.3, 0.3) * p["a0"],
              "r": rng.uniform(0.6, 0.85) * p["a0"] + 4.0, "len": rng.uniform(15.0, 25.0)}
    fat = rng.uniform(*fam.pericardial_fat_mm) if rng.random() < fam.fat else 0.0
    liver = None
    if rng.random() < fam.liver:  # centre (RAS mm) and semi-axes, jittered around a typical liver
        liver = {"centre": [55.0 + rng.normal(0, 10), -5.0 + rng.normal(0, 10), -95.0 + rng.normal(0, 10)],
                 "axes": [105.0 * rng.uniform(0.85, 1.15), 85.0 * rng.uniform(0.85, 1.15), 55.0 * rng.uniform(0.85, 1.15)]}
    return {"la": la, "fat_mm": float(fat), "fat_dir": float(rng.uniform(0, 2 * np.pi)), "liver": liver,
            "slice_profile": bool(rng.random() < fam.slice_profile)}


def _la(q: np.ndarray, c: float, p: dict[str, Any], la: dict[str, Any] | None) -> np.ndarray | None:
    """Left atrium above the mitral plane; it fills while the ventricle empties."""
    if la is None:
        return None
    s = 1.0 + 0.15 * c
    base_w = p["L0"] * c * (1 - p["s_long"])  # the AV plane descends with the LV base
    centre_w = base_w - 2.0 - la["len"] * s
    e = (((q[..., 0] - la["u"]) / (la["r"] * s)) ** 2 + ((q[..., 1] - la["v"]) / (la["r"] * s)) ** 2
         + ((q[..., 2] - centre_w) / (la["len"] * s)) ** 2)
    return (e <= 1.0) & (q[..., 2] < base_w - 1.0)


def _liver(world: np.ndarray, liver: dict[str, list[float]]) -> np.ndarray:
    c, a = liver["centre"], liver["axes"]
    return sum(((world[..., i] - c[i]) / a[i]) ** 2 for i in range(3)) <= 1.0


def _background(world: np.ndarray, gain: dict[str, float], liver: dict[str, list[float]] | None) -> np.ndarray:
    img = C._background(world)
    scale = {C.INTENSITY[k]: gain[k] for k in ("fat", "body", "lung", "aorta")}
    out = np.zeros_like(img)
    for base_level, level in scale.items():  # re-level the base thorax to this contrast
        out[img == np.float32(base_level)] = level
    if liver is not None:
        out[_liver(world, liver) & (img > 0)] = gain["liver"]
    return out


def _scene(q: np.ndarray, r: np.ndarray, theta: np.ndarray, c: float, p: dict[str, Any],
           akin: np.ndarray | None, ex: dict[str, Any], spacing: tuple[float, float, float]
           ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Label volume at state ``c`` and the unlabelled structures drawn in the image."""
    lab, rv_wall = C._frame_labels(q, r, theta, c, p, akin)
    parts = {"rv_wall": rv_wall}
    la = _la(q, c, p, ex["la"])
    if la is not None:
        parts["la"] = la & (lab == 0) & ~rv_wall
    if ex["fat_mm"] > 0:
        heart = (lab > 0) | rv_wall
        dist = ndimage.distance_transform_edt(~heart, sampling=spacing)
        side = np.cos(theta - ex["fat_dir"]) > -0.3  # fat covers part of the circumference
        parts["fat"] = (dist > 0) & (dist <= ex["fat_mm"]) & side & (q[..., 2] < p["L0"] + p["wall"])
    return lab, parts


def _render(lab: np.ndarray, parts: dict[str, np.ndarray], background: np.ndarray, gain: dict[str, float],
            blur: float, box: tuple[slice, ...]) -> np.ndarray:
    """Image of one plane: background, then (inside ``box``, where ``lab``/``parts`` live) the
    unlabelled structures and the labelled ones; in-plane point-spread blur."""
    img = background.copy()
    sub = img[box]
    for name in ("fat", "la", "rv_wall"):
        if name in parts:
            sub[parts[name]] = gain[name]
    for value, name in ((1, "rv"), (2, "myo"), (3, "lv")):
        sub[lab == value] = gain[name]
    img[box] = sub
    return ndimage.gaussian_filter(img, sigma=(blur, blur, 0.0))


def _heart_box(q: np.ndarray, r: np.ndarray, p: dict[str, Any]) -> tuple[slice, slice, slice]:
    """Index box of the voxels any heart structure (LV, RV, atrium, fat) can reach, with a
    margin: the heart model is evaluated there only (large fields of view are mostly body)."""
    k = p["rv_scale"] * p["rv_ref"]
    reach = max(0.5 * (p["a0"] + p["wall"]) + 1.05 * k + 3.0, 1.65 * k + 3.0,
                p["a0"] + p["wall"] + p["septal_extra"]) + 15.0
    w = q[..., 2]
    near = (r <= reach) & (w >= -75.0) & (w <= p["L0"] + p["wall"] + 15.0)
    if not near.any():
        return (slice(0, 0),) * 3
    idx = np.argwhere(near)
    lo, hi = idx.min(axis=0), idx.max(axis=0) + 1
    return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))  # type: ignore[return-value]


def _embed(part: np.ndarray, shape: tuple[int, ...], box: tuple[slice, ...]) -> np.ndarray:
    out = np.zeros(shape, part.dtype)
    out[box] = part
    return out


def _heart_cut(lab: np.ndarray, margin: int = 2) -> bool:
    """True when the heart touches the in-plane border (the field of view cuts it)."""
    edge = np.zeros(lab.shape[:2], bool)
    edge[:margin], edge[-margin:], edge[:, :margin], edge[:, -margin:] = True, True, True, True
    return bool((lab[edge] > 0).any())


def make_family_cardiac(case_id: str, seed: int, size: Size, group: str, family: str, noise: float | None,
                        borderline: bool) -> Phantom:
    """One cine of the ``randomised`` or ``heldout`` family (see ``make_cardiac``)."""
    fam = C.FAMILY_RANGES[family]
    rng = np.random.default_rng([seed, 0xCA2D, _FAMILY_SALT[family]])
    for attempt in range(_MAX_ATTEMPTS):
        draw = _draw_case(rng, size, group, fam, borderline)
        truth = C.cardiac_truth(draw["seg"], draw["height"], draw["weight"])
        if C.borderline_ok({**truth, "akinesia": draw["p"]["akinesia"] is not None}, group, draw["target"]):
            break
        log.debug("cardiac %s (%s): attempt %d rejected", case_id, family, attempt)
    else:
        raise ToolError(ErrorCode.internal, f"no {family} {group} heart met its ACDC criteria in "
                        f"{_MAX_ATTEMPTS} draws", case=case_id, hint="try another seed")
    cine = _image(draw, rng, fam, noise, case_id)
    seg = Mask(draw["seg"].data, draw["affine"], {"case_id": case_id}, labels=dict(C.LABELS))
    truth.update(group=group, akinesia=None, heart_frame={
        "base_centre_world": draw["base"].tolist(), "septal_axis": draw["frame"][:, 0].tolist(),
        "long_axis": draw["frame"][:, 2].tolist()})
    p = draw["p"]
    if p["akinesia"] is not None:
        ak = p["akinesia"]
        truth["akinesia"] = {"sector_centre_deg": ak["center_deg"], "sector_width_deg": ak["width_deg"],
                             "slices": C._akinetic_slices(draw["akin"], draw["labs"][truth["ed_frame"]])}
    truth["acdc_criteria"] = C.acdc_criteria(truth)
    truth.update(family=family, borderline=bool(borderline), acquisition=draw["acq"],
                 ed_es_margin_ml=_margins(truth))
    return Phantom(case_id, "cardiac", {"CINE": cine}, {"seg": seg},
                   {"height": draw["height"], "weight": draw["weight"]}, truth)


def _margins(truth: dict[str, Any]) -> dict[str, float]:
    """How far (mL) the true ED/ES volumes are from the next-best frame: how sharp the truth is."""
    lv = np.asarray(truth["lv_volume_curve_ml"])
    ed, es = truth["ed_frame"], truth["es_frame"]
    return {"ed": float(lv[ed] - np.delete(lv, ed).max()), "es": float(np.delete(lv, es).min() - lv[es])}


def _draw_case(rng: np.random.Generator, size: Size, group: str, fam: C.FamilyRanges, borderline: bool
               ) -> dict[str, Any]:
    height, weight = float(round(rng.uniform(*fam.height_cm))), float(round(rng.uniform(*fam.weight_kg)))
    variants = C._BORDERLINE[group]
    design, target = variants[int(rng.integers(len(variants)))] if borderline else (None, None)
    p = C._draw_anatomy(group, rng, C.bsa_mosteller(height, weight), design, rng.uniform(*fam.wall_scale))
    p["es_phase"] = rng.uniform(*fam.es_phase)
    frame, base = _heart_frame(rng, fam)
    st = _stack(size, rng, fam, frame, p)
    curve = str(fam.curves[int(rng.integers(len(fam.curves)))])
    delay = float(rng.uniform(0, st["n_frames"]))
    states = contraction(st["n_frames"], delay, p["es_phase"], curve, rng)
    ex = _extras(rng, fam, p)
    for shrink in (1.0, 0.6, 0.3, 0.0):  # move the heart back towards the centre if the FOV cuts it
        affine = _affine(st, frame, base, p, shrink)
        world = world_coords(affine, st["shape"])
        q = (world - base) @ frame
        r, theta = np.hypot(q[..., 0], q[..., 1]), np.arctan2(q[..., 1], q[..., 0])
        akin = C._akinesia_weight(theta, q[..., 2], p)
        box = _heart_box(q, r, p)
        qb, rb, tb, ab = q[box], r[box], theta[box], None if akin is None else akin[box]
        lab0 = _embed(C._frame_labels(qb, rb, tb, 0.0, p, ab)[0], r.shape, box)
        if not _heart_cut(lab0):
            break
    labs = [_embed(C._frame_labels(qb, rb, tb, float(c), p, ab)[0], r.shape, box) for c in states]
    seg = Mask(np.stack(labs, axis=-1), affine, {}, labels=dict(C.LABELS))
    acq = {"trigger_delay_frames": round(delay, 3), "curve": curve, "es_phase": round(float(p["es_phase"]), 4),
           "apex_first": st["apex_first"], "extra_slices": st["extra_slices"],
           "heart_offset_mm": round(float(shrink * st["offset_mm"]), 2), "left_atrium": ex["la"] is not None,
           "pericardial_fat_mm": round(ex["fat_mm"], 2), "liver": ex["liver"] is not None,
           "borderline_design": {k: list(v) for k, v in (design or {}).items()},
           "borderline_target": None if target is None else {"value": target[0], "threshold": target[1]}}
    return {"height": height, "weight": weight, "p": p, "design": design, "target": target, "frame": frame, "base": base,
            "stack": st, "states": states, "extras": ex, "affine": affine, "world": world, "q": q, "r": r,
            "theta": theta, "akin": akin, "labs": labs, "seg": seg, "acq": acq, "box": box}


def _image(draw: dict[str, Any], rng: np.random.Generator, fam: C.FamilyRanges, noise: float | None,
           case_id: str) -> Cine:
    """Render the cine of an accepted draw: contrast, partial volume, shading, noise, scale."""
    bssfp = dict(C.INTENSITY, la=C.INTENSITY["lv"] * 0.97, liver=0.4)
    mix = rng.uniform(*fam.contrast_mix)  # 0: bSSFP levels, 1: gradient-echo levels
    gain = {k: (bssfp[k] + mix * (C.INTENSITY_GRE[k] - bssfp[k])) * rng.uniform(1 - fam.contrast_jitter,
                                                                              1 + fam.contrast_jitter)
            for k in bssfp}
    blur = rng.uniform(*fam.blur_vox)
    st, p, ex = draw["stack"], draw["p"], draw["extras"]
    affine, frame, base = draw["affine"], draw["frame"], draw["base"]
    # through-plane slice profile: the image averages three planes across the slice thickness
    offsets = (-st["spacing"][2] / 3, 0.0, st["spacing"][2] / 3) if ex["slice_profile"] else (0.0,)
    normal = affine[:3, 2] / np.linalg.norm(affine[:3, 2])
    planes, box = [], draw["box"]
    for off in offsets:
        world = draw["world"] + off * normal
        q = (world[box] - base) @ frame
        r, theta = np.hypot(q[..., 0], q[..., 1]), np.arctan2(q[..., 1], q[..., 0])
        planes.append((q, r, theta, C._akinesia_weight(theta, q[..., 2], p), _background(world, gain, ex["liver"])))
    frames = []
    for c in draw["states"]:
        imgs = [_render(*_scene(q, r, th, float(c), p, ak, ex, st["spacing"]), bg, gain, blur, box)
                for q, r, th, ak, bg in planes]
        frames.append(np.mean(imgs, axis=0))
    data = np.stack(frames, axis=-1).astype(np.float32)
    strength = rng.uniform(*fam.bias)
    data *= bias_field(data.shape[:3], rng, strength)[..., None]
    sigma = (rng.uniform(*fam.noise) if noise is None else noise) * gain["lv"]
    data = rician_noise(data, sigma, rng)
    scale = _log_uniform(rng, *fam.intensity_scale)
    rr = float(rng.uniform(600, 1100))
    n = st["n_frames"]
    draw["acq"].update(noise_sigma_rel=round(sigma / gain["lv"], 4), bias_strength=round(float(strength), 3),
                       intensity_scale=round(scale, 3), contrast_mix=round(float(mix), 3), blur_vox=round(float(blur), 3),
                       slice_profile=ex["slice_profile"])
    return Cine((data * scale).astype(np.float32), affine.copy(),
                {"case_id": case_id, "sequence": "cine", "rr_ms": rr, "frame_ms": rr / n})


# whole-anatomy label cines (SynthSeg-style training): the heart keeps LABELS' codes 1-3, every
# other structure bcer paints gets a code of its own; 0 is air outside the body
ANATOMY_LABELS = {1: "RV", 2: "MYO", 3: "LV", 4: "subcutaneous_fat", 5: "body", 6: "lung", 7: "aorta",
                  8: "liver", 9: "pericardial_fat", 10: "left_atrium", 11: "rv_wall"}
_THORAX_CODES = {"fat": 4, "body": 5, "lung": 6, "aorta": 7}


def _thorax_labels(world: np.ndarray, liver: dict[str, list[float]] | None) -> np.ndarray:
    """The base thorax (``cardiac._background``) and the family's liver as label codes."""
    img = C._background(world)
    out = np.zeros(img.shape, np.int16)
    for name, code in _THORAX_CODES.items():
        out[img == np.float32(C.INTENSITY[name])] = code
    if liver is not None:
        out[_liver(world, liver) & (img > 0)] = 8
    return out


# Systolic wall thickening of training label cines (``anatomy_label_cine(thickening=True)``):
# per heart, the end-systolic ring area of a slice is multiplied by a gain drawn uniformly
# from 1 (the phantoms' law: each slice keeps its myocardial area) to THICKENING_GAIN_MAX /
# long-axis shortening (the myocardium keeps its volume as the ventricle shortens, with a
# spread for fibre geometry and trabeculae on top). The range holds both laws, so a network
# trained on it has to read the wall from the image rather than from one law. (A first
# version drew only the upper part, 1-1.15 / shortening; neither version made a network
# that replaced the default, see docs/segmenters.md.)
THICKENING_GAIN_MAX = 1.15

# Concentric hypertrophy of training label cines (``anatomy_label_cine(hypertrophy=True)``):
# the families' free walls end at 15 mm (HCM 11-13 mm, times a family's wall scale), with the
# extra thickness in the septum only. Hypertensive, infiltrative and many hypertrophic hearts
# thicken all round, 15 mm and beyond (HCM: >= 15 mm; "massive" >= 30 mm, rare). With
# probability HYPERTROPHY_P a training heart's ED free wall is redrawn uniformly between its
# own thickness and HYPERTROPHY_WALL_MAX_MM; its septal excess and cavity stay as drawn.
HYPERTROPHY_P = 0.5
HYPERTROPHY_WALL_MAX_MM = 25.0


def anatomy_label_cine(seed: int, family: str, group: str, size: Size = "small", thickening: bool = False,
                       hypertrophy: bool = False) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A family heart in its thorax as a whole-anatomy label cine (``ANATOMY_LABELS``).

    The heart, its motion, the stack geometry and the surroundings (left atrium, pericardial
    fat, liver) are drawn as for :func:`make_family_cardiac`, from a seed stream apart from
    it; no image is rendered and the draw is not checked against the ACDC criteria (a
    training label map need not be a clean group example). With ``thickening``, the systolic
    wall thickens by a per-heart gain anywhere between the phantoms' slice-area law and
    myocardial volume conservation (``THICKENING_GAIN_MAX``; drawn from a stream of its own,
    so the rest of the cine is the same draw): the phantoms' law alone under-thickens, most
    in dilated hearts, whose rings barely shrink. With ``hypertrophy``, half the hearts get a
    concentrically thickened free wall (``HYPERTROPHY_WALL_MAX_MM``; a stream of its own too):
    the families' hearts never thicken all round beyond 15 mm.

    Returns:
        (labels (X, Y, Z, T) int16, affine, {"ed_frame", "es_frame"} of the LV volume curve,
        with ``thickening`` the "thickening_gain" drawn, with ``hypertrophy`` the ED
        "free_wall_mm").
    """
    fam = C.FAMILY_RANGES[family]
    rng = np.random.default_rng([int(seed), 0xCA2D, _FAMILY_SALT[family], 0xA7])
    draw = _draw_case(rng, size, group, fam, borderline=False)
    truth = C.cardiac_truth(draw["seg"], draw["height"], draw["weight"])
    st, p, ex, box = draw["stack"], draw["p"], draw["extras"], draw["box"]
    if thickening:
        gain = np.random.default_rng([int(seed), 0x7B1C, _FAMILY_SALT[family]]).uniform(
            1.0, THICKENING_GAIN_MAX / p["s_long"])
        p = {**p, "thickening_gain": float(gain)}
    if hypertrophy:
        hr = np.random.default_rng([int(seed), 0x4E7, _FAMILY_SALT[family]])
        if hr.random() < HYPERTROPHY_P:
            p = {**p, "wall": float(hr.uniform(p["wall"], max(p["wall"], HYPERTROPHY_WALL_MAX_MM)))}
            box = _heart_box(draw["q"], draw["r"], p)  # a thicker wall reaches further
    thorax = _thorax_labels(draw["world"], ex["liver"])
    q, r, theta, akin = draw["q"][box], draw["r"][box], draw["theta"][box], draw["akin"]
    akin = None if akin is None else akin[box]
    frames = []
    for c in draw["states"]:
        lab, parts = _scene(q, r, theta, float(c), p, akin, ex, st["spacing"])
        out = thorax.copy()
        sub = out[box]
        for name, code in (("fat", 9), ("la", 10), ("rv_wall", 11)):
            if name in parts:
                sub[parts[name]] = code
        sub[lab > 0] = lab[lab > 0]
        out[box] = sub
        frames.append(out)
    info: dict[str, Any] = {k: int(truth[k]) for k in ("ed_frame", "es_frame")}
    if thickening:
        info["thickening_gain"] = p["thickening_gain"]
    if hypertrophy:
        info["free_wall_mm"] = float(p["wall"])
    return np.stack(frames, axis=-1), draw["affine"].copy(), info


register_family_builder("cardiac", make_family_cardiac)
