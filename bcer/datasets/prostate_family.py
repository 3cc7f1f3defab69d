"""The prostate phantom families (``randomised``, ``heldout``): pelvis, fields of view, lesions.

``prostate.make_prostate(..., family=...)`` comes here for every family but ``base``. The
parameter ranges of each family are ``prostate.FAMILIES`` (one table); the pelvis around the
gland is ``pelvis``; the lesion placement, PI-RADS truth and label conventions are
``prostate``'s, so a family case is read and scored exactly like a base one.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..contracts.artifacts import Image
from ..contracts.errors import ErrorCode, ToolError
from .degrade import rigid_matrix
from .geometry import world_coords
from .phantom import Phantom, Size
from .generators import register_family_builder
from .prostate import (BORDERLINE_KINDS, FAMILIES, GRIDS, LESION_ADC_MAX_FRACTION, PIRADS_RULE, LesionSpec,
                       _Blob, _borderline, _place_lesions, phantom_labels)


def _family_lesions(R: dict[str, Any], values: dict[str, tuple[float, float, float]]) -> LesionSpec:
    def design(rng: np.random.Generator, zone: str) -> tuple[float, float]:
        lo, hi = R["pz_lesion_adc" if zone == "PZ" else "tz_lesion_adc"]
        hi = min(hi, LESION_ADC_MAX_FRACTION * values[zone][1])  # restricted enough to be seen at all
        return float(rng.uniform(lo, max(lo, hi))), float(rng.uniform(*R["lesion_t2_ratio"]))

    return LesionSpec(lambda rng: float(rng.uniform(*R["lesion_diam_mm"])), design, R["lesion_ripple"], R["p_pz"],
                      lambda size: True, 6)


# ----------------------------------------------------------------------------- families

_FAMILY_SALT = {"randomised": 0x5A11, "heldout": 0x4E1D}  # a seed gives unrelated cases in each family


def _family_misalignment(rng: np.random.Generator, R: dict[str, Any], misalign: bool, center: np.ndarray):
    identity = (not misalign) or rng.random() < R["p_identity"]
    rot = [0.0] * 3 if identity else rng.uniform(-1, 1, 3) * R["misalign_rot_deg"]
    trans = [0.0] * 3 if identity else rng.uniform(-1, 1, 3) * R["misalign_trans_mm"]
    move = rigid_matrix(rot, trans, center)
    return move, {"fixed": "T2w", "moving": ["ADC", "DWI"], "matrix": move.tolist(),
                  "matrix_adc_to_t2w": np.linalg.inv(move).tolist(), "rotation_deg": list(map(float, rot)),
                  "translation_mm": list(map(float, trans)), "center_world": center.tolist(), "identity": bool(identity),
                  "direction": "tissue at T2w world point p appears in ADC/DWI at matrix @ p "
                               "(ITK fixed->moving with fixed=T2w, moving=ADC)"}


def _offset(rng: np.random.Generator, radial: tuple[float, float], si: float, shrink: float) -> np.ndarray:
    phi = rng.uniform(0, 2 * np.pi)
    r = rng.uniform(*radial) * shrink
    return np.array([r * np.cos(phi), r * np.sin(phi), rng.uniform(-si, si) * shrink])


def _family_grids(rng: np.random.Generator, R: dict[str, Any], size: Size, anat: Any, move: np.ndarray):
    """T2w and ADC grids whose fields of view hold the whole gland (offsets shrink until they do)."""
    from .pelvis import family_grid, gland_inside

    inv = np.linalg.inv(move)
    for attempt in range(12):
        shrink = 0.8 ** attempt
        t2_center = anat.center + _offset(rng, R["gland_offset_mm"], R["gland_offset_si_mm"], shrink)
        adc_center = t2_center + _offset(rng, R["adc_center_offset_mm"], 0.3 * R["adc_center_offset_mm"][1], shrink)
        order = rng.random(2) < 0.5  # per series: numbered along or against the slice normal
        t2 = family_grid(rng, GRIDS[size]["T2w"], R, t2_center, bool(order[0]))
        adc = family_grid(rng, GRIDS[size]["ADC"], R, adc_center, bool(order[1]))
        t2_pts = world_coords(*t2)
        adc_pts = world_coords(*adc) @ inv[:3, :3].T + inv[:3, 3]
        if gland_inside(anat.gland.inside(t2_pts)) and gland_inside(anat.gland.inside(adc_pts)):
            return t2, adc, ("descending" if order[0] else "ascending", "descending" if order[1] else "ascending")
    raise ToolError(ErrorCode.internal, "no field of view holds the gland", hint="check the family's FOV ranges")


def make_family_prostate(case_id: str, seed: int, size: Size, n_lesions: int | None, misalign: bool, noise: float | None,
                         bladder: bool | None, family: str, borderline: bool) -> Phantom:
    """One phantom of the ``randomised`` or ``heldout`` family (see ``prostate.make_prostate``)."""
    from .pelvis import random_pelvis, render

    R = FAMILIES[family]
    rng = np.random.default_rng([int(seed), _FAMILY_SALT[family]])
    n = int(rng.choice([0, 1, 2], p=[0.25, 0.45, 0.30])) if n_lesions is None else int(n_lesions)
    anat = random_pelvis(rng, R, _Blob)
    if bladder is False:
        anat.bladder = None
    move, motion = _family_misalignment(rng, R, misalign, anat.center)
    (t2_aff, t2_shape), (adc_aff, adc_shape), order = _family_grids(rng, R, size, anat, move)
    t2_pts = world_coords(t2_aff, t2_shape)
    specs = [_family_lesions(R, anat.values)] * n
    if borderline and n:
        specs[0] = _borderline(specs[0], str(rng.choice(BORDERLINE_KINDS)))
    _place_lesions(rng, anat, t2_pts, n, specs)
    level = float(rng.uniform(*R["noise"])) if noise is None else float(noise)
    look = {"noise": level, "adc_sd": level * 1000.0 * float(rng.uniform(*R["adc_noise_factor"])),
            "t2_scale": float(np.exp(rng.uniform(*np.log(R["t2_scale"])))),
            "dwi_scale": float(np.exp(rng.uniform(*np.log(R["dwi_scale"])))),
            "b_value": float(rng.choice(R["b_values"])), "adc_integer": bool(rng.random() < R["p_adc_integer"])}
    t2_imgs, zones, lesions = render(anat, t2_pts, rng, look, R)
    adc_world = world_coords(adc_aff, adc_shape)
    inv = np.linalg.inv(move)
    d_imgs, zones_adc, lesions_adc = render(anat, adc_world @ inv[:3, :3].T + inv[:3, 3], rng, look, R)
    names = R["series"]
    t2 = Image(t2_imgs["T2w"], t2_aff, {"sequence": "T2w", "series_description": names["T2w"], "slice_order": order[0]})
    adc = Image(d_imgs["ADC"], adc_aff, {"sequence": "ADC", "units": "1e-6 mm2/s", "series_description": names["ADC"],
                                        "slice_order": order[1]})
    dwi = Image(d_imgs["DWI"], adc_aff.copy(), {"sequence": "DWI", "b_value": look["b_value"],
                                                 "series_description": names["DWI"], "slice_order": order[1]})
    labels, lesion_truth = phantom_labels(anat, t2, adc, zones, lesions, zones_adc, lesions_adc, t2_pts, adc_world)
    gland_c = world_coords(t2_aff, t2_shape)[zones > 0].mean(axis=0)
    fov_c = t2_aff[:3, :3] @ ((np.asarray(t2_shape) - 1) / 2.0) + t2_aff[:3, 3]
    truth = {"domain": "prostate", "family": family, "n_lesions": len(lesion_truth), "lesions": lesion_truth,
             "gland_volume_ml": labels["gland"].volume_ml(1),
             "pz_volume_ml": labels["zones"].volume_ml(1), "tz_volume_ml": labels["zones"].volume_ml(2),
             "max_category": max((les["category"] for les in lesion_truth), default=1),
             "misalignment": motion, "adc_units": "1e-6 mm2/s", "b_value": look["b_value"], "pirads_rule": PIRADS_RULE,
             "tissue_values": {k: list(v) for k, v in anat.values.items()}, "has_bladder": anat.bladder is not None,
             "has_vesicles": bool(anat.vesicles), "capsule_mm": anat.capsule_mm, "tz_nodules_and_calcifications": len(anat.nodules),
             "gland_offset_from_fov_centre_mm": float(np.linalg.norm(gland_c - fov_c)),
             "slice_order": {"T2w": order[0], "ADC": order[1], "DWI": order[1]},
             "obliquity_deg": {k: _tilt_deg(a) for k, a in (("T2w", t2_aff), ("ADC", adc_aff))},
             "intensity": {k: look[k] for k in ("noise", "adc_sd", "t2_scale", "dwi_scale", "adc_integer")}}
    metadata = {"age": int(rng.integers(50, 82)), "sex": "M", "psa_ng_ml": round(float(rng.uniform(2, 30)), 1),
                "b_value": look["b_value"], "history": "elevated PSA; rule out clinically significant prostate cancer"}
    return Phantom(case_id, "prostate", {"T2w": t2, "ADC": adc, "DWI": dwi}, labels, metadata, truth)


def anatomy_label_map(seed: int, family: str, n_lesions: int, size: Size = "small"
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A family pelvis as a whole-anatomy label map, for SynthSeg-style training.

    Every tissue class of ``pelvis.PELVIS_TISSUES`` is its own label (its index; air is 0), so a
    randomised image gives bladder, rectum, vesicles, muscle and bone their own contrasts and a
    network learns the gland against its real neighbours, not against noise. Lesion ``i`` in
    zone ``z`` (1 PZ, 2 TZ) is label ``len(PELVIS_TISSUES) + 2 * (i - 1) + z``. The grid is the
    family's T2w grid for this draw; the seed stream is apart from ``make_prostate``'s.

    Returns:
        (labels, zones with 0/1 PZ/2 TZ, lesions included in their zone, affine).
    """
    from .pelvis import PELVIS_TISSUES, random_pelvis

    R = FAMILIES[family]
    rng = np.random.default_rng([int(seed), _FAMILY_SALT[family], 0xA7])
    anat = random_pelvis(rng, R, _Blob)
    (t2_aff, t2_shape), _, _ = _family_grids(rng, R, size, anat, np.eye(4))
    pts = world_coords(t2_aff, t2_shape)
    _place_lesions(rng, anat, pts, n_lesions, [_family_lesions(R, anat.values)] * n_lesions)
    cls, zones = anat.classes(pts)
    lesions = anat.lesion_labels(pts, zones)
    lab = cls.astype(np.int16)
    inside = lesions > 0
    lab[inside] = len(PELVIS_TISSUES) + 2 * (lesions[inside] - 1) + zones[inside]
    return lab, zones.astype(np.int16), t2_aff


def _tilt_deg(affine: np.ndarray) -> float:
    """Angle (deg) between a grid's slice normal and the S-I axis."""
    a = np.asarray(affine, np.float64)[:3, :3]
    n = np.cross(a[:, 0], a[:, 1])
    return float(np.degrees(np.arccos(min(1.0, abs(n[2]) / np.linalg.norm(n)))))


register_family_builder("prostate", make_family_prostate)
