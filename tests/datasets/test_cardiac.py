"""Cardiac cine phantoms: truth measured from the masks, ED/ES, ACDC group criteria, geometry."""
from __future__ import annotations

import time

import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.cardiac import GROUPS, acdc_criteria, bsa_mosteller, make_cardiac
from bcer.datasets.geometry import world_coords


@pytest.fixture(scope="module", params=GROUPS)
def phantom(request):
    return make_cardiac(f"c_{request.param}", seed=11, size="small", group=request.param)


def test_shapes_and_geometry(phantom):
    cine, seg = phantom.sequences["CINE"], phantom.labels["seg"]
    x, y, z, t = cine.shape
    assert (x, y) == (64, 56) and 6 <= z <= 8 and 10 <= t <= 12
    assert seg.shape == cine.shape and np.array_equal(seg.affine, cine.affine)
    sx, sy, sz = cine.spacing
    assert sx == pytest.approx(sy) and 2.5 < sx < 3.2 and 10 < sz < 14
    assert cine.orientation not in ("RAS",)  # oblique/flipped stack by default
    assert np.isfinite(cine.data).all() and cine.data.dtype == np.float32
    assert set(np.unique(seg.data)) == {0, 1, 2, 3}
    _assert_whole_heart(phantom)


def test_ed_es_are_lv_volume_extremes(phantom):
    seg, v = phantom.labels["seg"], phantom.truth
    lv = np.array([np.count_nonzero(seg.data[..., f] == 3) for f in range(seg.shape[3])])
    assert v["ed_frame"] == int(np.argmax(lv)) and v["es_frame"] == int(np.argmin(lv))
    assert lv[v["ed_frame"]] > lv[v["es_frame"]]
    # end-systole at roughly a third of the cycle after end-diastole
    n = seg.shape[3]
    assert 0.2 <= ((v["es_frame"] - v["ed_frame"]) % n) / n <= 0.5


def test_truth_volumes_match_masks(phantom):
    seg, v = phantom.labels["seg"], phantom.truth
    ed, es = v["ed_frame"], v["es_frame"]
    ml = seg.voxel_volume_ml
    checks = {"lv_edv_ml": (3, ed), "lv_esv_ml": (3, es), "rv_edv_ml": (1, ed), "rv_esv_ml": (1, es)}
    for key, (label, f) in checks.items():
        measured = np.count_nonzero(seg.data[..., f] == label) * ml
        assert v[key] == pytest.approx(measured, rel=0.01), key
    myo = np.count_nonzero(seg.data[..., ed] == 2) * ml
    assert v["myo_mass_g"] == pytest.approx(1.05 * myo, rel=0.01)
    assert v["lv_ef_pct"] == pytest.approx(100 * (v["lv_edv_ml"] - v["lv_esv_ml"]) / v["lv_edv_ml"], rel=1e-6)
    assert v["bsa_m2"] == pytest.approx(np.sqrt(phantom.metadata["height"] * phantom.metadata["weight"] / 3600))


def test_group_satisfies_its_acdc_criterion(phantom):
    v = phantom.truth
    crit = acdc_criteria(v)
    assert crit[v["group"]], (v["group"], crit)
    others = [g for g, ok in crit.items() if ok and g != v["group"]]
    assert others == [], f"{v['group']} also meets {others}"


@pytest.mark.parametrize("group", GROUPS)
def test_groups_hold_across_seeds(group):
    for seed in range(3):
        v = make_cardiac("x", seed, "small", group=group).truth
        assert acdc_criteria(v)[group], (group, seed)


def test_minf_akinetic_sector_does_not_move():
    ph = make_cardiac("m", 4, "small", group="MINF")
    seg, v = ph.labels["seg"], ph.truth
    ak = v["akinesia"]
    assert ak and len(ak["slices"]) >= 2
    frame = v["heart_frame"]
    u, w = np.array(frame["septal_axis"]), np.array(frame["long_axis"])
    q = world_coords(seg.affine, seg.shape) - np.array(frame["base_centre_world"])
    ang = np.rad2deg(np.arctan2(q @ np.cross(w, u), q @ u))
    dth = np.abs((ang - ak["sector_centre_deg"] + 180) % 360 - 180)
    inside, remote = dth < ak["sector_width_deg"] / 2 - 10, dth > ak["sector_width_deg"] / 2 + 30
    ks = np.zeros(seg.shape[2], bool)
    ks[ak["slices"]] = True
    ed, es = seg.data[..., v["ed_frame"]] == 3, seg.data[..., v["es_frame"]] == 3
    sel_in, sel_rem = inside & ks, remote & ks
    change_in = 1 - np.count_nonzero(es & sel_in) / np.count_nonzero(ed & sel_in)
    change_rem = 1 - np.count_nonzero(es & sel_rem) / np.count_nonzero(ed & sel_rem)
    assert change_in < 0.15 < change_rem


def test_world_geometry_drives_anatomy():
    """The heart sits where the affine says (left of midline), whatever the array orientation."""
    ph = make_cardiac("g", 2, "small", group="NOR")
    seg = ph.labels["seg"]
    lv = seg.data[..., ph.truth["ed_frame"]] == 3
    centroid = world_coords(seg.affine, seg.shape)[lv].mean(axis=0)
    assert centroid[0] < 0  # RAS: the LV is on the patient's left
    straight = make_cardiac("g", 2, "small", group="NOR", oblique=False)
    assert straight.sequences["CINE"].orientation == "RAS"


def test_full_size_ranges():
    ph = make_cardiac("f", 1, "full", group="DCM")
    sx, sy, sz = ph.sequences["CINE"].spacing
    x, y, z, t = ph.sequences["CINE"].shape
    assert 1.25 <= sx <= 1.6 and 8.5 <= sz <= 11.5 and 8 <= z <= 11 and 20 <= t <= 30 and x != y
    _assert_whole_heart(ph)


def _assert_whole_heart(ph):
    """The stack spans base to apex: no LV cavity in the end slices at any frame."""
    lv = (ph.labels["seg"].data == 3).sum(axis=(0, 1, 3))
    assert lv[0] == 0 and lv[-1] == 0 and lv.sum() > 0


def test_deterministic_and_fast():
    t0 = time.perf_counter()
    a = make_cardiac("d", 5, "small")
    assert time.perf_counter() - t0 < 1.5
    b = make_cardiac("d", 5, "small")
    assert np.array_equal(a.sequences["CINE"].data, b.sequences["CINE"].data)
    assert a.truth["group"] in GROUPS and a.truth == b.truth


def test_bad_arguments():
    with pytest.raises(ToolError) as e:
        make_cardiac("b", 0, group="HEALTHY")
    assert e.value.code is ErrorCode.value_range and "NOR" in e.value.hint
    with pytest.raises(ToolError) as e:
        make_cardiac("b", 0, size="huge")
    assert e.value.code is ErrorCode.value_range


def test_bsa_mosteller():
    assert bsa_mosteller(180, 80) == pytest.approx(2.0, abs=1e-9)
