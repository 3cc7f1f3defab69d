"""Prostate phantom families: randomised (tuning) and heldout (measurement) ranges, exact truth,
per-series oblique grids numbered in either direction, borderline lesions, family plumbing."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pydicom
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world
from bcer.datasets.generators import family_kwargs
from bcer.datasets.layouts import dicom as dicom_layout
from bcer.datasets.phantom import Phantom
from bcer.datasets.prostate import FAMILIES, make_prostate, pirads_category
from bcer.datasets.synth import synth_cohort
from bcer.io import load_sequence


@lru_cache(maxsize=None)
def _family(family: str) -> tuple[Phantom, ...]:
    return tuple(make_prostate(f"{family[:2]}{s}", s, n_lesions=(1, 2, 0)[s % 3], family=family) for s in range(8))


def _centre(mask, affine) -> np.ndarray:
    return vox2world(affine, np.argwhere(mask)).mean(axis=0)


@pytest.mark.parametrize("family", ["randomised", "heldout"])
def test_truth_is_exact_and_geometry_varies(family: str) -> None:
    cases = _family(family)
    R = FAMILIES[family]
    offsets, tilts, orders, idents = [], [], set(), []
    for ph in cases:
        t2, adc, dwi = (ph.sequences[k] for k in ("T2w", "ADC", "DWI"))
        zones, gland, lesions = (np.asarray(ph.labels[k].data) for k in ("zones", "gland", "lesions"))
        assert ph.truth["family"] == family
        np.testing.assert_array_equal(zones > 0, gland == 1)
        assert np.all(zones[lesions > 0] > 0)  # lesions inside the gland
        assert ph.truth["gland_volume_ml"] == pytest.approx(np.count_nonzero(gland) * t2.voxel_volume_ml)
        np.testing.assert_array_equal(adc.affine, dwi.affine)
        assert not np.allclose(t2.affine[:3, :3] / t2.spacing, adc.affine[:3, :3] / adc.spacing)  # own grids
        for les in ph.truth["lesions"]:
            assert les["category"] == pirads_category(les["zone"], les["size_mm"], les["adc"], les["t2_ratio"])
            assert les["side"] == ("R" if les["centroid_world"][0] > 0 else "L")
        # the whole gland is in both fields of view, and not at the T2w centre
        for arr in (gland, np.asarray(ph.labels["gland_adc"].data)):
            assert not (arr[[0, -1]].any() or arr[:, [0, -1]].any() or arr[..., [0, -1]].any())
        offsets.append(ph.truth["gland_offset_from_fov_centre_mm"])
        tilts += list(ph.truth["obliquity_deg"].values())
        orders |= set(ph.truth["slice_order"].values())
        idents.append(ph.truth["misalignment"]["identity"])
        assert ph.truth["b_value"] in R["b_values"] and ph.sequences["DWI"].meta["b_value"] == ph.truth["b_value"]
    lo, hi = R["oblique_deg"]
    assert all(lo - 0.5 <= t <= hi + 0.5 for t in tilts)
    assert orders == {"ascending", "descending"}
    assert max(offsets) > 10.0
    assert any(idents) and not all(idents)  # identity-truth cases and moved ones


def test_families_differ_where_the_table_says() -> None:
    rnd, held = _family("randomised"), _family("heldout")
    assert min(ph.truth["obliquity_deg"]["T2w"] for ph in held) >= 15.0 - 0.5
    assert np.median([ph.truth["gland_volume_ml"] for ph in held]) > np.median([ph.truth["gland_volume_ml"] for ph in rnd])
    assert min(ph.truth["intensity"]["t2_scale"] for ph in held) > max(ph.truth["intensity"]["t2_scale"] for ph in rnd)
    assert all(ph.sequences["T2w"].meta["series_description"] == "t2_tse_tra_p2" for ph in held)
    assert all(np.all(np.mod(ph.sequences["ADC"].data, 1) == 0) for ph in held)  # integer ADC convention
    assert sum(ph.truth["tz_nodules_and_calcifications"] for ph in held) > 0
    # both families have BPH nodules/calcifications (what tuning must see); held-out has more
    assert 0 < sum(ph.truth["tz_nodules_and_calcifications"] for ph in rnd) < sum(
        ph.truth["tz_nodules_and_calcifications"] for ph in held)
    # a seed gives unrelated cases in different families, the same case twice in one
    a, b = make_prostate("x", 3, family="randomised"), make_prostate("x", 3, family="randomised")
    np.testing.assert_array_equal(a.sequences["T2w"].data, b.sequences["T2w"].data)
    assert a.truth == b.truth
    assert a.sequences["T2w"].shape != make_prostate("x", 3, family="heldout").sequences["T2w"].shape


def test_lesion_adc_stays_below_its_zone() -> None:
    for ph in _family("randomised") + _family("heldout"):
        for les in ph.truth["lesions"]:
            zone_adc = ph.truth["tissue_values"][les["zone"]][1]
            assert les["adc"] <= 0.82 * zone_adc + 1e-6


@pytest.mark.parametrize("family", ["base", "randomised"])
def test_borderline_lesions(family: str) -> None:
    kinds, near = set(), 0
    for s in range(12):
        ph = make_prostate(f"b{s}", s, n_lesions=2, family=family, borderline=True)
        les = ph.truth["lesions"][0]
        kinds.add(les["borderline"])
        near += {"adc": abs(les["adc"] - 850) <= 45, "size": 12.5 <= les["size_mm"] <= 17.5,
                 "t2": abs(les["t2_ratio"] - 0.6) <= 0.07 and les["zone"] == "TZ",
                 "small": les["size_mm"] < 12.5}[les["borderline"]]
        assert "borderline" not in ph.truth["lesions"][1]
    assert len(kinds) >= 3 and near == 12


def test_base_family_is_unchanged_by_the_new_keywords() -> None:
    a, b = make_prostate("p", 5, n_lesions=1), make_prostate("p", 5, n_lesions=1, family="base", borderline=False)
    np.testing.assert_array_equal(a.sequences["T2w"].data, b.sequences["T2w"].data)
    assert a.truth == b.truth and "family" not in a.truth
    assert all("borderline" not in les for les in a.truth["lesions"])


def test_dicom_series_numbered_in_opposite_directions_read_back_exactly(tmp_path) -> None:
    ph = next(p for p in _family("heldout") if len(set(p.truth["slice_order"].values())) == 2)
    (case,) = dicom_layout.write([ph], tmp_path)
    assert case.domain == "prostate" and set(case.sequences) == {"T2w", "ADC", "DWI"}
    directions = {}
    for name, art in ph.sequences.items():
        back = load_sequence(case.sequences[name])
        np.testing.assert_allclose(back.affine, art.affine, atol=1e-5)
        step = (float(art.data.max()) - float(art.data.min())) / 65535
        assert np.max(np.abs(back.data - art.data)) <= 0.5 * step + 1e-3
        files = sorted(p for p in (tmp_path / case.id).glob(f"{art.meta['series_description']}/*.dcm"))
        first, second = (pydicom.dcmread(str(f), stop_before_pixels=True) for f in files[:2])
        iop = np.asarray(first.ImageOrientationPatient, float)
        step_mm = np.asarray(second.ImagePositionPatient, float) - np.asarray(first.ImagePositionPatient, float)
        assert int(second.InstanceNumber) == int(first.InstanceNumber) + 1
        directions[name] = "ascending" if np.dot(np.cross(iop[:3], iop[3:]), step_mm) > 0 else "descending"
    assert directions == ph.truth["slice_order"]
    assert directions["T2w"] != directions["ADC"]


def test_family_plumbing_and_errors(tmp_path) -> None:
    cases = synth_cohort("prostate", 2, tmp_path / "d", layout="dicom", family="randomised")
    assert [c.ground_truth["values"]["family"] for c in cases] == ["randomised"] * 2
    with pytest.raises(ToolError) as e:
        make_prostate("x", 1, family="heldOut")
    assert e.value.code is ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        synth_cohort("prostate", 1, tmp_path / "e", family="nope")
    assert e.value.code is ErrorCode.value_range and not (tmp_path / "e").exists()

    def base_only(case_id, seed, size):  # a generator without families
        raise AssertionError("never called")

    assert family_kwargs(base_only, "base") == {}
    with pytest.raises(ToolError) as e:
        family_kwargs(base_only, "heldout")
    assert e.value.code is ErrorCode.value_range and "base only" in str(e.value)


def test_family_ranges_pins_a_range_paired_and_restores() -> None:
    """A pinned tz_scale (0.8: a larger TZ, a thin PZ) changes only the zones: the pinned draw
    still consumes its random number, so the same case keeps its gland, motion, grids and
    intensities (paired conditions); the table is restored afterwards, also on error, and a
    misspelt field is refused."""
    from bcer.datasets.prostate import family_ranges

    before = dict(FAMILIES["randomised"])
    free = make_prostate("ra005", 5, n_lesions=0, family="randomised")
    with family_ranges("randomised", tz_scale=(0.8, 0.8)) as rng_table:
        assert rng_table["tz_scale"] == (0.8, 0.8)
        thin = make_prostate("ra005", 5, n_lesions=0, family="randomised")
    assert FAMILIES["randomised"] == before
    g0, g1 = np.asarray(free.labels["gland"].data), np.asarray(thin.labels["gland"].data)
    assert np.array_equal(g0, g1)
    assert np.allclose(free.labels["gland"].affine, thin.labels["gland"].affine)
    for key in ("capsule_mm", "tissue_values", "has_bladder", "has_vesicles", "misalignment"):
        assert free.truth[key] == thin.truth[key], key  # drawn right after tz_scale, and later
    assert free.truth["intensity"] == thin.truth["intensity"]
    assert thin.truth["tz_volume_ml"] > 1.2 * free.truth["tz_volume_ml"]
    assert thin.truth["pz_volume_ml"] < free.truth["pz_volume_ml"]
    with pytest.raises(RuntimeError), family_ranges("randomised", tz_scale=(0.8, 0.8)):
        raise RuntimeError("inside")
    assert FAMILIES["randomised"] == before
    with pytest.raises(KeyError), family_ranges("randomised", tz_scal=(0.8, 0.8)):
        pass


@pytest.mark.parametrize("family,n_lesions", [("randomised", 2), ("heldout", 1)])
def test_anatomy_label_map_holds_the_pelvis_and_its_zones(family: str, n_lesions: int) -> None:
    """The whole-anatomy label map (SynthSeg-style training): every zone voxel carries the PZ or
    TZ label or a lesion label coding that zone, the neighbours are there as their own labels,
    the lesions asked for are placed, and the gland is an adult prostate's size."""
    from bcer.datasets.pelvis import PELVIS_TISSUES
    from bcer.datasets.prostate_family import anatomy_label_map

    tissues = list(PELVIS_TISSUES)
    lab, zones, affine = anatomy_label_map(5, family, n_lesions)
    k = len(tissues)
    lesion = lab > k
    assert set(np.unique(lesion_ids := (lab[lesion] - k - 1) // 2 + 1)) == set(range(1, n_lesions + 1))
    coded_zone = np.where(lesion, (lab - k - 1) % 2 + 1, np.where(lab == tissues.index("PZ"), 1,
                                                                   np.where(lab == tissues.index("TZ"), 2, 0)))
    np.testing.assert_array_equal(coded_zone, zones)
    assert lesion_ids.size and {"fat", "rectal_wall", "muscle"} <= {tissues[v] for v in np.unique(lab[lab < k])}
    gland_ml = (zones > 0).sum() * abs(np.linalg.det(affine[:3, :3])) / 1000.0
    assert 10.0 < gland_ml < 120.0
