"""Brain tumour phantoms: exact truth, realistic contrasts, known degradations."""
from __future__ import annotations

import time

import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world
from bcer.datasets.brain import CONTRASTS, make_brain
from bcer.datasets.degrade import move_image


@pytest.fixture(scope="module")
def hgg():
    return make_brain("b-hgg", seed=11, size="small", grade="HGG", side="left")


@pytest.fixture(scope="module")
def lgg_degraded():
    return make_brain("b-lgg", seed=12, size="small", grade="LGG", side="right",
                      noise=0.04, bias=0.2, misalign=True)


def test_grid_is_oblique_anisotropic_non_square(hgg):
    shapes = {hgg.sequences[c].shape for c in CONTRASTS}
    assert len(shapes) == 1
    shape = shapes.pop()
    a = hgg.sequences["T1"].affine
    d = a[:3, :3] / np.linalg.norm(a[:3, :3], axis=0)
    assert not np.allclose(np.abs(d), np.eye(3), atol=1e-3)  # oblique
    assert shape[0] != shape[1] and len(set(np.round(hgg.sequences["T1"].spacing, 3))) > 1
    assert all(3.0 <= s <= 4.5 for s in hgg.sequences["T1"].spacing)
    for m in hgg.labels.values():
        assert m.shape == shape and np.allclose(m.affine, a)
    plain = make_brain("b-plain", seed=11, oblique=False)
    np.testing.assert_allclose(plain.sequences["T1"].affine[:3, :3] / plain.sequences["T1"].spacing,
                               np.eye(3), atol=1e-12)


@pytest.mark.parametrize("which", ["hgg", "lgg_degraded"])
def test_volumes_and_side_match_the_mask(which, request):
    ph = request.getfixturevalue(which)
    seg = ph.labels["seg"]
    t = ph.truth
    for lab in (1, 2, 4):
        assert seg.volume_ml(lab) == pytest.approx(t["volumes_ml"][str(lab)], rel=0.01, abs=1e-9)
    wt = np.count_nonzero(seg.data) * seg.voxel_volume_ml
    tc = np.count_nonzero(np.isin(seg.data, (1, 4))) * seg.voxel_volume_ml
    assert t["WT_ml"] == pytest.approx(wt, rel=0.01) and t["TC_ml"] == pytest.approx(tc, rel=0.01)
    assert t["ET_ml"] == pytest.approx(seg.volume_ml(4), rel=0.01, abs=1e-9)
    assert t["brain_ml"] == pytest.approx(ph.labels["brain"].volume_ml(1), rel=0.01)
    assert 1100 < t["brain_ml"] < 2100 and 15 < t["WT_ml"] < 250
    centroid = vox2world(seg.affine, np.argwhere(seg.data > 0)).mean(axis=0)
    np.testing.assert_allclose(t["centroid_world"], centroid, atol=1e-6)
    assert np.sign(centroid[0]) == (1 if t["side"] == "right" else -1)
    # the whole tumour is on its side of the midline and inside the brain
    xs = vox2world(seg.affine, np.argwhere(seg.data > 0))[:, 0]
    assert np.all(xs > 0) if t["side"] == "right" else np.all(xs < 0)
    assert np.all(ph.labels["brain"].data[seg.data > 0] == 1)


def test_grades(hgg, lgg_degraded):
    assert hgg.truth["grade"] == "HGG" and hgg.truth["ET_ml"] > 2.0
    assert set(np.unique(hgg.labels["seg"].data)) == {0, 1, 2, 4}
    assert lgg_degraded.truth["grade"] == "LGG" and lgg_degraded.truth["ET_ml"] == 0.0
    assert set(np.unique(lgg_degraded.labels["seg"].data)) == {0, 1, 2}


def test_contrasts_are_realistic(hgg):
    seg, brain = hgg.labels["seg"].data, hgg.labels["brain"].data
    normal = (brain == 1) & (seg == 0)
    mean = {c: {k: float(hgg.references[c].data[m].mean()) for k, m in
                {"normal": normal, "bg": brain == 0, 1: seg == 1, 2: seg == 2, 4: seg == 4}.items()}
            for c in CONTRASTS}
    assert mean["T1c"][4] > 1.5 * mean["T1c"]["normal"]  # enhancing rim bright on T1c
    assert mean["T1c"][1] < 0.5 * mean["T1c"]["normal"]  # necrosis dark on T1c
    assert mean["FLAIR"][2] > 1.4 * mean["FLAIR"]["normal"]  # oedema bright on FLAIR
    assert mean["T2"][2] > 1.4 * mean["T2"]["normal"]  # and on T2
    assert mean["T1"][4] < 1.2 * mean["T1"]["normal"]  # no enhancement without contrast
    assert all(mean[c]["bg"] < 0.05 * mean[c]["normal"] for c in CONTRASTS)
    # CSF (brightest on T2 within the brain) is dark on T1 and FLAIR
    t2 = hgg.references["T2"].data
    csf = normal & (t2 > np.percentile(t2[normal], 97))
    for c in ("T1", "FLAIR"):
        assert float(hgg.references[c].data[csf].mean()) < 0.7 * mean[c]["normal"]
    # WM (brightest on T1) is darker than average on T2
    t1 = hgg.references["T1"].data
    wm = normal & (t1 > np.percentile(t1[normal], 80))
    assert float(t2[wm].mean()) < mean["T2"]["normal"]


def test_clean_case_has_references_equal_to_inputs(hgg):
    for c in CONTRASTS:
        assert np.array_equal(hgg.sequences[c].data, hgg.references[c].data)
    assert hgg.truth["misalignment"] is None and hgg.truth["noise_sigma"] == {}


def test_deterministic_from_seed(hgg):
    again = make_brain("b-hgg", seed=11, size="small", grade="HGG", side="left")
    for c in CONTRASTS:
        assert np.array_equal(again.sequences[c].data, hgg.sequences[c].data)
    assert again.truth == hgg.truth
    other = make_brain("b-other", seed=99, size="small", grade="HGG", side="left")
    assert other.truth["WT_ml"] != hgg.truth["WT_ml"]


def test_misalignment_is_known_and_invertible(lgg_degraded):
    mis = lgg_degraded.truth["misalignment"]
    which = mis["contrast"]
    assert which in ("T1", "T2", "FLAIR")
    m = np.asarray(mis["matrix"])
    assert 3.0 <= max(abs(a) for a in mis["rotation_deg"]) <= 7.0
    # compare shapes, not intensities: undo noise/bias effects by using clean copies
    clean = lgg_degraded.references[which]
    moved = move_image(clean, m)
    undone = move_image(moved, np.linalg.inv(m))
    brain = lgg_degraded.labels["brain"].data > 0
    err_moved = np.abs(moved.data - clean.data)[brain].mean()
    err_undone = np.abs(undone.data - clean.data)[brain].mean()
    assert err_undone < 0.5 * err_moved
    # the stored input of that contrast is the moved one (plus bias and noise)
    data = lgg_degraded.sequences[which].data
    corr_moved = np.corrcoef(data[brain], moved.data[brain])[0, 1]
    corr_clean = np.corrcoef(data[brain], clean.data[brain])[0, 1]
    assert corr_moved > corr_clean + 0.05


def test_noise_sigma_matches_background(lgg_degraded):
    sig = lgg_degraded.truth["noise_sigma"]
    assert set(sig) == set(CONTRASTS)
    moved = lgg_degraded.truth["misalignment"]["contrast"]
    for c in [c for c in CONTRASTS if c != moved]:  # moved tissue covers the clean background
        clean = lgg_degraded.references[c].data
        bg = (lgg_degraded.labels["brain"].data == 0) & (clean < 1.0)
        rayleigh_mean = float(lgg_degraded.sequences[c].data[bg].mean())
        assert rayleigh_mean == pytest.approx(sig[c] * np.sqrt(np.pi / 2), rel=0.15)


@pytest.mark.parametrize("kw,code", [({"grade": "XGG"}, ErrorCode.value_range),
                                      ({"side": "middle"}, ErrorCode.value_range),
                                      ({"size": "huge"}, ErrorCode.value_range)])
def test_bad_arguments_are_typed(kw, code):
    with pytest.raises(ToolError) as e:
        make_brain("bad", seed=0, **kw)
    assert e.value.code == code and e.value.context.get("case") == "bad"


def test_small_is_fast(hgg):
    t0 = time.perf_counter()
    make_brain("b-speed", seed=5, size="small")
    assert time.perf_counter() - t0 < 5.0  # < ~0.5 s when the machine is not shared
