"""Prostate phantom: exact ground truth (sides, zones, boxes, volumes, misalignment, PI-RADS)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import pdist

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world, world2vox
from bcer.datasets.prostate import GRIDS, make_prostate, pirads_category

SEEDS = range(10)


@pytest.fixture(scope="module")
def cohort():
    """Ten small cases with two lesions each (20 lesions), plus five with a random count."""
    return [make_prostate(f"p{s:03d}", s, n_lesions=2) for s in SEEDS] + \
           [make_prostate(f"r{s:03d}", 100 + s) for s in range(5)]


def _points(mask, affine):
    return vox2world(affine, np.argwhere(mask))


def test_sequences_grids_and_orientation(cohort):
    ph = cohort[0]
    t2, adc, dwi = (ph.sequences[k] for k in ("T2w", "ADC", "DWI"))
    np.testing.assert_allclose(t2.spacing, GRIDS["small"]["T2w"][0])
    np.testing.assert_allclose(adc.spacing, GRIDS["small"]["ADC"][0])
    assert t2.shape == GRIDS["small"]["T2w"][1] and adc.shape == dwi.shape == GRIDS["small"]["ADC"][1]
    assert t2.shape[0] != t2.shape[1]  # non-square matrix
    np.testing.assert_array_equal(adc.affine, dwi.affine)
    assert all(ph.sequences["T2w"].orientation != "RAS" for ph in cohort)
    assert {ph.sequences["T2w"].orientation for ph in cohort} != {"LPS"}  # oblique/flipped variety
    assert make_prostate("a", 1, oblique=False).sequences["T2w"].orientation == "LPS"
    for lab in ("zones", "gland", "lesions"):
        np.testing.assert_array_equal(ph.labels[lab].affine, t2.affine)
    np.testing.assert_array_equal(ph.labels["lesions_adc"].affine, adc.affine)


def test_same_seed_same_phantom():
    a, b = make_prostate("x", 7), make_prostate("x", 7)
    np.testing.assert_array_equal(a.sequences["T2w"].data, b.sequences["T2w"].data)
    np.testing.assert_array_equal(a.labels["lesions"].data, b.labels["lesions"].data)
    assert a.truth == b.truth
    assert not np.array_equal(a.sequences["ADC"].data, make_prostate("x", 8).sequences["ADC"].data)


def test_n_lesions_respected_and_validated(cohort):
    assert all(ph.truth["n_lesions"] == 2 == ph.labels["lesions"].data.max() for ph in cohort[:10])
    assert make_prostate("z", 3, n_lesions=0).truth["lesions"] == []
    assert {ph.truth["n_lesions"] for ph in cohort[10:]} <= {0, 1, 2}
    with pytest.raises(ToolError) as e:
        make_prostate("z", 3, n_lesions=3)
    assert e.value.code is ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        make_prostate("z", 3, size="huge")
    assert e.value.code is ErrorCode.value_range


def test_zones_partition_the_gland_and_volumes_are_counts(cohort):
    for ph in cohort:
        zones, gland = ph.labels["zones"].data, ph.labels["gland"].data
        np.testing.assert_array_equal(zones > 0, gland == 1)
        vox = ph.labels["zones"].voxel_volume_ml
        assert ph.truth["gland_volume_ml"] == pytest.approx(np.count_nonzero(gland) * vox, rel=1e-9)
        assert ph.truth["pz_volume_ml"] + ph.truth["tz_volume_ml"] == pytest.approx(ph.truth["gland_volume_ml"])
        assert 15.0 < ph.truth["gland_volume_ml"] < 60.0  # adult gland
        # TZ is central/anterior, PZ the posterior shell: the PZ centroid lies posterior (RAS y)
        aff = ph.labels["zones"].affine
        assert _points(zones == 1, aff)[:, 1].mean() < _points(zones == 2, aff)[:, 1].mean() - 3.0


def test_lesion_side_zone_size_and_boxes_follow_the_masks(cohort):
    n = 0
    for ph in cohort:
        lab, aff = ph.labels["lesions"].data, ph.labels["lesions"].affine
        lab_adc, aff_adc = ph.labels["lesions_adc"].data, ph.labels["lesions_adc"].affine
        zones = ph.labels["zones"].data
        for les in ph.truth["lesions"]:
            m = lab == les["label"]
            pts = _points(m, aff)
            centroid = pts.mean(axis=0)
            assert les["side"] == ("R" if centroid[0] > 0 else "L")
            np.testing.assert_allclose(les["centroid_world"], centroid, atol=1e-6)
            assert les["zone"] == ("PZ" if np.count_nonzero(zones[m] == 1) > np.count_nonzero(zones[m] == 2) else "TZ")
            assert np.all(zones[m] > 0)  # lesions stay inside the gland
            idx = np.argwhere(m)
            assert les["box_voxel"] == [idx.min(0).tolist(), (idx.max(0) + 1).tolist()]
            idx_a = np.argwhere(lab_adc == les["label"])
            assert les["box_voxel_adc"] == [idx_a.min(0).tolist(), (idx_a.max(0) + 1).tolist()]
            np.testing.assert_allclose(les["box_world"], [pts.min(0), pts.max(0)], atol=1e-9)
            assert les["size_mm"] == pytest.approx(pdist(pts).max(), rel=1e-9)  # brute force diameter
            assert les["volume_ml"] == pytest.approx(m.sum() * ph.labels["lesions"].voxel_volume_ml)
            n += 1
    assert n >= 20


def test_lesion_contrast_and_adc_values_are_realistic(cohort):
    for ph in cohort[:10]:
        t2, adc, dwi = (ph.sequences[k].data for k in ("T2w", "ADC", "DWI"))
        lab, lab_adc, gland_adc = (ph.labels[k].data for k in ("lesions", "lesions_adc", "gland_adc"))
        zones = ph.labels["zones"].data
        for les in ph.truth["lesions"]:
            ma = lab_adc == les["label"]
            assert les["adc"] < 1000 and abs(les["adc_mean"] - les["adc"]) < 30
            assert les["adc_mean"] == pytest.approx(float(adc[ma].mean()), rel=1e-6)
            assert dwi[ma].mean() > 1.5 * dwi[(gland_adc == 1) & (lab_adc == 0)].mean()  # DWI-bright
            zone = 1 if les["zone"] == "PZ" else 2
            normal = t2[(zones == zone) & (lab == 0)].mean()
            assert t2[lab == les["label"]].mean() < 0.9 * normal  # T2-dark
            assert abs(les["t2_ratio_measured"] - les["t2_ratio"]) < 0.03
        pz_adc, tz_adc = ph.truth["tissue_values"]["PZ"][1], ph.truth["tissue_values"]["TZ"][1]
        assert 1500 <= pz_adc <= 1800 and 1100 <= tz_adc <= 1300
        assert ph.sequences["ADC"].meta["units"] == "1e-6 mm2/s"


def test_pirads_rule_table_and_truth_follows_it(cohort):
    assert pirads_category("PZ", 10, 700, 0.8) == 4
    assert pirads_category("PZ", 20, 700, 0.8) == 5
    assert pirads_category("PZ", 20, 950, 0.4) == 3  # PZ ignores T2
    assert pirads_category("TZ", 10, 950, 0.4) == 4
    assert pirads_category("TZ", 20, 950, 0.4) == 5
    assert pirads_category("TZ", 10, 700, 0.8) == 3
    assert pirads_category("TZ", 20, 700, 0.8) == 4  # TZ 3 upgraded by DWI 5
    cats, zones, sides = set(), set(), set()
    for ph in cohort:
        for les in ph.truth["lesions"]:
            assert les["category"] == pirads_category(les["zone"], les["size_mm"], les["adc"], les["t2_ratio"])
            # margins keep measured values from crossing a threshold
            assert not 12.5 <= les["size_mm"] <= 17.5 and not 800 <= les["adc"] <= 900
            assert not 0.5 <= les["t2_ratio"] <= 0.7
            cats.add(les["category"]), zones.add(les["zone"]), sides.add(les["side"])
        assert ph.truth["max_category"] == max((x["category"] for x in ph.truth["lesions"]), default=1)
    assert cats == {3, 4, 5} and zones == {"PZ", "TZ"} and sides == {"L", "R"}


def test_recorded_misalignment_maps_t2w_points_onto_adc(cohort):
    for ph in cohort[:10]:
        mis = ph.truth["misalignment"]
        m = np.array(mis["matrix"])
        np.testing.assert_allclose(np.array(mis["matrix_adc_to_t2w"]) @ m, np.eye(4), atol=1e-9)
        angle = np.degrees(np.arccos(np.clip((np.trace(m[:3, :3]) - 1) / 2, -1, 1)))
        assert angle > 0.5 or np.linalg.norm(m[:3, 3]) > 0.5  # really misaligned
        # The gland centroid maps to the ADC-grid gland centroid (coarse grid: within 1 mm).
        c_t2 = _points(ph.labels["gland"].data == 1, ph.labels["gland"].affine).mean(0)
        c_adc = _points(ph.labels["gland_adc"].data == 1, ph.labels["gland_adc"].affine).mean(0)
        assert np.linalg.norm(m[:3, :3] @ c_t2 + m[:3, 3] - c_adc) < 1.0
        assert np.linalg.norm(c_t2 - c_adc) > 1.0  # without the matrix they do not agree
        for les in ph.truth["lesions"]:  # a lesion point lands in the same lesion on ADC
            p = m[:3, :3] @ np.asarray(les["centroid_world"]) + m[:3, 3]
            ijk = np.rint(world2vox(ph.labels["lesions_adc"].affine, p)).astype(int)
            near = ph.labels["lesions_adc"].data[tuple(slice(max(i - 1, 0), i + 2) for i in ijk)]
            assert les["label"] in near


def test_no_misalignment_gives_identity():
    ph = make_prostate("a", 11, misalign=False, n_lesions=1)
    np.testing.assert_array_equal(ph.truth["misalignment"]["matrix"], np.eye(4))
    c_t2 = _points(ph.labels["gland"].data == 1, ph.labels["gland"].affine).mean(0)
    c_adc = _points(ph.labels["gland_adc"].data == 1, ph.labels["gland_adc"].affine).mean(0)
    assert np.linalg.norm(c_t2 - c_adc) < 1.0


def test_full_size_grid_and_truth():
    ph = make_prostate("f", 21, size="full", n_lesions=1)
    t2, adc = ph.sequences["T2w"], ph.sequences["ADC"]
    np.testing.assert_allclose(t2.spacing, (0.5, 0.5, 3.0))
    np.testing.assert_allclose(adc.spacing, (2.0, 2.0, 3.0))
    (les,) = ph.truth["lesions"]
    pts = _points(ph.labels["lesions"].data == 1, t2.affine)
    assert les["side"] == ("R" if pts[:, 0].mean() > 0 else "L")
    assert les["category"] == pirads_category(les["zone"], les["size_mm"], les["adc"], les["t2_ratio"])
    m = np.array(ph.truth["misalignment"]["matrix"])
    c_t2 = _points(ph.labels["gland"].data == 1, t2.affine).mean(0)
    c_adc = _points(ph.labels["gland_adc"].data == 1, adc.affine).mean(0)
    assert np.linalg.norm(m[:3, :3] @ c_t2 + m[:3, 3] - c_adc) < 0.5
