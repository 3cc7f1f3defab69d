"""Cardiac cine phantom families: ranges from the one table, truth measured on the labels,
trigger delay and slice order drawn, exact ACDC group, borderline cases near a threshold."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.cardiac import _BORDER_BAND, FAMILY_RANGES, GROUPS, acdc_criteria, make_cardiac
from bcer.datasets.cardiac_family import contraction


@lru_cache(maxsize=16)
def _ph(family: str, seed: int, group: str, borderline: bool = False):
    return make_cardiac(f"{family[:2]}{seed}", seed, "small", group=group, family=family, borderline=borderline)


@pytest.mark.parametrize("family,seed", [("randomised", s) for s in range(5)] + [("heldout", 0), ("heldout", 1)])
def test_family_case_is_consistent(family: str, seed: int) -> None:
    group = GROUPS[seed % 5]
    ph = _ph(family, seed, group)
    fam, t = FAMILY_RANGES[family], ph.truth
    cine, seg = ph.sequences["CINE"], ph.labels["seg"]
    assert seg.shape == cine.shape and np.array_equal(seg.affine, cine.affine)
    sx, sy, sz = cine.spacing
    assert fam.spacing_mm["small"][0] - 1e-6 <= sx <= fam.spacing_mm["small"][1] + 1e-6 and sx == pytest.approx(sy)
    lo, hi = fam.frames["small"]
    assert lo <= cine.n_frames <= hi and t["family"] == family
    lv = (np.asarray(seg.data) == 3).sum(axis=(0, 1, 2))
    assert (t["ed_frame"], t["es_frame"]) == (int(np.argmax(lv)), int(np.argmin(lv)))
    crit = acdc_criteria(t)
    assert crit[group] and sum(crit.values()) == 1, crit
    assert np.isfinite(cine.data).all() and set(np.unique(seg.data)) == {0, 1, 2, 3}
    assert t["ed_es_margin_ml"]["ed"] >= 0 and t["ed_es_margin_ml"]["es"] >= 0


def test_randomised_draws_trigger_delay_and_slice_order() -> None:
    cases = [_ph("randomised", s, GROUPS[s % 5]) for s in range(5)]
    assert len({c.truth["ed_frame"] for c in cases}) >= 3  # ED is not pinned to frame 0
    assert {c.truth["acquisition"]["apex_first"] for c in cases} == {True, False}
    # the heldout family's ranges are not the randomised ones
    r, h = FAMILY_RANGES["randomised"], FAMILY_RANGES["heldout"]
    assert r.frames["small"][1] < h.frames["small"][0] and r.fov_mm[1] < h.fov_mm[1]
    assert r.curves != h.curves


def test_same_seed_same_case() -> None:
    a = make_cardiac("d", 3, "small", group="DCM", family="randomised")
    b = _ph("randomised", 3, "DCM")
    assert np.array_equal(a.sequences["CINE"].data, b.sequences["CINE"].data) and a.truth == b.truth


@pytest.mark.parametrize("family,group,seed", [("base", "DCM", 0), ("base", "RV", 4), ("randomised", "MINF", 3)])
def test_borderline_case_is_near_its_threshold(family: str, group: str, seed: int) -> None:
    ph = _ph(family, seed, group, True)
    t = ph.truth
    target = t["borderline_target"] if family == "base" else t["acquisition"]["borderline_target"]
    assert abs(t[target["value"]] - target["threshold"]) <= _BORDER_BAND[target["value"]]
    crit = acdc_criteria(t)
    assert crit[group] and sum(crit.values()) == 1


def test_volume_curve_models_have_one_ed_and_one_es() -> None:
    rng = np.random.default_rng(0)
    for model in ("cosine", "skewed", "physiological"):
        c = contraction(400, 0.0, 0.35, model, rng)
        assert int(np.argmin(c)) == 0 and abs(int(np.argmax(c)) - 140) <= 1
        assert c.min() == pytest.approx(0.0, abs=1e-6) and c.max() == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ToolError) as e:
        contraction(10, 0.0, 0.35, "flat", rng)
    assert e.value.code is ErrorCode.value_range


def test_unknown_family() -> None:
    with pytest.raises(ToolError) as e:
        make_cardiac("x", 0, family="held-out")
    assert e.value.code is ErrorCode.value_range and "heldout" in e.value.hint


def test_family_ranges_pins_one_nuisance_and_keeps_the_rest_paired() -> None:
    from bcer.datasets.cardiac import family_ranges

    before = FAMILY_RANGES["randomised"]
    plain = make_cardiac("p0", 5003, "small", group="HCM", family="randomised")
    with family_ranges("randomised", noise=(0.06, 0.06)) as pinned:
        assert pinned.noise == (0.06, 0.06) and FAMILY_RANGES["randomised"] is pinned
        noisy = make_cardiac("p0", 5003, "small", group="HCM", family="randomised")
    assert FAMILY_RANGES["randomised"] is before  # restored
    # the pinned draw consumed its random number: same heart, same frames, only the noise differs
    assert noisy.truth["ed_frame"] == plain.truth["ed_frame"] and noisy.truth["es_frame"] == plain.truth["es_frame"]
    assert np.array_equal(np.asarray(noisy.labels["seg"].data), np.asarray(plain.labels["seg"].data))
    assert not np.allclose(np.asarray(noisy.sequences["CINE"].data), np.asarray(plain.sequences["CINE"].data))
    with pytest.raises(TypeError):
        with family_ranges("randomised", no_such_range=(1, 2)):
            pass
    with pytest.raises(RuntimeError):
        with family_ranges("randomised", liver=1.0):
            raise RuntimeError("a failing case")
    assert FAMILY_RANGES["randomised"] is before


@pytest.mark.parametrize("family,group", [("randomised", "DCM"), ("heldout", "HCM")])
def test_anatomy_label_cine_holds_the_thorax_around_a_beating_heart(family: str, group: str) -> None:
    """The whole-anatomy label cine for SynthSeg-style training: the heart keeps its codes 1-3
    and beats (ED is the frame of the largest LV, ES of the smallest), the thorax has its own
    codes (body, lung, subcutaneous fat), and the heart lies inside the body."""
    from bcer.datasets.cardiac_family import ANATOMY_LABELS, anatomy_label_cine

    lab, affine, frames = anatomy_label_cine(3, family, group)
    assert lab.ndim == 4 and affine.shape == (4, 4) and lab.max() <= max(ANATOMY_LABELS)
    codes = set(np.unique(lab).tolist())
    assert {1, 2, 3, 4, 5, 6} <= codes
    lv = (lab == 3).sum(axis=(0, 1, 2))
    assert frames["ed_frame"] == int(np.argmax(lv)) and frames["es_frame"] == int(np.argmin(lv))
    assert lv.max() > 1.1 * lv.min()  # a DCM ejects little
    heart = (lab[..., 0] >= 1) & (lab[..., 0] <= 3)
    assert not (heart & (lab[..., 1] == 0)).any()  # no heart voxel becomes air in the next frame
    static = lab[..., 0] == lab[..., -1]
    assert (lab[..., 0][~static] <= 11).all() and static.mean() > 0.8  # only the heart region changes


@pytest.mark.parametrize("group", ["NOR", "DCM"])
def test_anatomy_label_cine_thickening_spans_both_laws(group: str) -> None:
    """``thickening=True``: the same cine (cavities unchanged in every frame) with a per-heart
    systolic gain between the phantoms' slice-area law (1) and myocardial volume conservation
    (1 / long-axis shortening, times up to THICKENING_GAIN_MAX); over hearts the gains span
    the range, and a larger gain keeps more of the myocardial volume at end-systole."""
    from bcer.datasets.cardiac_family import THICKENING_GAIN_MAX, anatomy_label_cine

    plain, affine, frames = anatomy_label_cine(5, "randomised", group)
    thick, affine2, info = anatomy_label_cine(5, "randomised", group, thickening=True)
    assert {k: info[k] for k in frames} == frames and np.array_equal(affine, affine2)
    assert np.array_equal(plain == 3, thick == 3)  # the LV cavity, hence ED/ES and the EF, is the same
    assert _myo_es_over_ed(thick, frames) > _myo_es_over_ed(plain, frames)
    assert _myo_es_over_ed(thick, frames) <= THICKENING_GAIN_MAX + 0.05
    gains, kept = [], []  # the myocardial volume a gain adds at ES, against the same heart's plain cine
    for seed in range(8):
        lab, _, got = anatomy_label_cine(seed, "randomised", group, thickening=True)
        base, _, _ = anatomy_label_cine(seed, "randomised", group)
        gains.append(got["thickening_gain"])
        kept.append(_myo_es_over_ed(lab, got) - _myo_es_over_ed(base, got))
    assert min(gains) >= 1.0 and max(gains) <= THICKENING_GAIN_MAX / 0.86  # s_long >= 0.86
    assert max(gains) - min(gains) > 0.05  # a range, not one law
    assert min(kept) >= 0 and np.corrcoef(gains, kept)[0, 1] > 0.8


def _myo_es_over_ed(lab: np.ndarray, frames: dict) -> float:
    myo = (lab == 2).sum(axis=(0, 1, 2))
    return float(myo[frames["es_frame"]] / myo[frames["ed_frame"]])


def test_anatomy_label_cine_hypertrophy_thickens_the_free_wall_all_round() -> None:
    """``hypertrophy=True``: about half the hearts get a concentric free wall between their own
    thickness and HYPERTROPHY_WALL_MAX_MM; their cavities (hence ED/ES and the EF) are the same
    draw, and the wall measured on the labels (the epicardium's median distance to the cavity
    in the largest ED slice) is the drawn thickness within a voxel. The other hearts are the plain cine, voxel for voxel."""
    from scipy import ndimage

    from bcer.datasets.cardiac_family import HYPERTROPHY_WALL_MAX_MM, anatomy_label_cine

    thick_hearts = 0
    for seed in range(8):
        plain, affine, frames = anatomy_label_cine(seed, "randomised", "NOR")
        lab, _, info = anatomy_label_cine(seed, "randomised", "NOR", hypertrophy=True)
        assert np.array_equal(plain == 3, lab == 3) and {k: info[k] for k in frames} == frames
        wall = info["free_wall_mm"]
        assert 7.5 * 0.9 <= wall <= HYPERTROPHY_WALL_MAX_MM
        if np.array_equal(plain, lab):
            continue
        thick_hearts += 1
        ed = lab[..., frames["ed_frame"]]
        sp = np.linalg.norm(affine[:3, :3], axis=0)
        lv_area = (ed == 3).sum(axis=(0, 1))
        k = int(np.argmax(lv_area))  # a mid-ventricular slice: the ring is cut across
        dist = ndimage.distance_transform_edt(ed[..., k] != 3, sampling=sp[:2])
        epi = (ed[..., k] == 2) & ndimage.binary_dilation(ed[..., k] != 2) & ~ndimage.binary_dilation(ed[..., k] == 3)
        ring = dist[epi & (ed[..., k] != 1)]
        assert abs(np.median(ring) - wall) <= sp[0]  # the epicardium's distance to the cavity
    assert 2 <= thick_hearts <= 6
