"""The independent evaluation family: its truths are what its written files say, its laterality
is the patient's, and it shares no code with the training generators."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from bcer.datasets.independent import TASK_LAYOUT, write_family
from bcer.datasets.independent.acquire import Grid, render
from bcer.datasets.independent.gland import make_gland_case
from bcer.datasets.independent.heart import acdc_group, make_heart_case
from bcer.datasets.independent.tumour import make_tumour_case

PKG = Path(__file__).resolve().parents[2] / "bcer" / "datasets" / "independent"
TRAINING = {"cardiac", "cardiac_family", "prostate", "prostate_family", "brain", "pelvis", "randomise", "degrade",
            "degraded", "synth", "geometry", "kspace", "generators"}


def _voxel_ml(img: nib.Nifti1Image) -> float:
    return float(abs(np.linalg.det(img.affine[:3, :3]))) / 1000.0


def test_imports_no_training_generator() -> None:
    for f in PKG.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                bad = [a.name for a in node.names if set(a.name.split(".")) & TRAINING]
                assert not bad, f"{f.name} imports {bad}"
            if isinstance(node, ast.ImportFrom):
                mod = (node.module or "").split(".")
                names = {a.name for a in node.names}
                assert not (set(mod) & TRAINING) and not (node.level == 2 and not node.module and names & TRAINING), \
                    f"{f.name} imports {node.module} {names}"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Two cases per task, written in their layouts and read back as bcer reads them."""
    return write_family(tmp_path_factory.mktemp("independent"), 2, seed=3)


def _truth_ref(case, name: str) -> nib.Nifti1Image:
    ref = case.ground_truth["labels"][name]
    return nib.load(ref["path"])


def test_cardiac_truth_matches_written_masks(written) -> None:
    for case in written["cardiac_report"]:
        t = case.ground_truth["values"]
        seg = nib.load(case.ground_truth["labels"]["seg"]["path"])
        lab = np.asarray(seg.dataobj)
        lv = np.count_nonzero(lab == 3, axis=(0, 1, 2)) * _voxel_ml(seg)
        rv = np.count_nonzero(lab == 1, axis=(0, 1, 2)) * _voxel_ml(seg)
        ed, es = int(np.argmax(lv)), int(np.argmin(lv))
        assert (ed, es) == (t["ed_frame"], t["es_frame"])
        assert t["lv_edv_ml"] == pytest.approx(lv[ed], rel=1e-6)
        assert t["lv_ef_pct"] == pytest.approx(100 * (lv[ed] - lv[es]) / lv[ed], abs=1e-6)
        assert t["rv_ef_pct"] == pytest.approx(100 * (rv[ed] - rv[es]) / rv[ed], abs=1e-6)
        assert 5.0 < t["lv_ef_pct"] < 85.0 and t["lv_esv_ml"] > 10.0
        cine = nib.load(case.sequences["CINE"].path)
        assert np.allclose(cine.affine, seg.affine) and cine.shape == seg.shape


@pytest.mark.parametrize("group", ["NOR", "DCM", "HCM", "MINF", "RV"])
def test_each_designed_heart_meets_its_acdc_group(group: str) -> None:
    t = make_heart_case("h", 11, group).truth
    assert t["group"] == group == t["designed_as"]


def test_acdc_rules_order() -> None:
    base = {"lv_ef_pct": 60.0, "max_wall_thickness_mm": 9.0, "lv_mass_index_g_m2": 70.0, "lv_edvi_ml_m2": 80.0,
            "rv_edvi_ml_m2": 80.0, "rv_ef_pct": 55.0}
    assert acdc_group(base, 0) == "NOR"
    assert acdc_group({**base, "max_wall_thickness_mm": 16.0}, 0) == "HCM"
    assert acdc_group({**base, "lv_ef_pct": 30.0, "lv_edvi_ml_m2": 120.0}, 0) == "DCM"
    assert acdc_group({**base, "lv_ef_pct": 30.0, "lv_edvi_ml_m2": 120.0}, 3) == "MINF"
    assert acdc_group({**base, "rv_ef_pct": 30.0}, 0) == "RV"


def test_prostate_truth_matches_written_masks(written) -> None:
    for case in written["prostate_report"]:
        t = case.ground_truth["values"]
        gland = _truth_ref(case, "gland")
        g = np.asarray(gland.dataobj) > 0
        assert t["gland_volume_ml"] == pytest.approx(g.sum() * _voxel_ml(gland), rel=1e-6)
        lesions = np.asarray(_truth_ref(case, "lesions").dataobj)
        assert t["n_lesions"] == len(t["lesions"]) == len(set(np.unique(lesions)) - {0})
        for les in t["lesions"]:
            m = lesions == les["label"]
            assert les["volume_ml"] == pytest.approx(m.sum() * _voxel_ml(gland), rel=1e-6)
            assert g[m].all()  # every lesion lies in the gland
            lo, hi = les["box_voxel"]
            assert m[lo[0]:hi[0], lo[1]:hi[1], lo[2]:hi[2]].sum() == m.sum()
    assert sorted(len(c.ground_truth["values"]["lesions"]) for c in written["prostate_report"]) == [1, 2]
    assert {s for c in written["prostate_report"] for s in c.sequences} >= {"T2w", "ADC", "DWI"}


def test_lesion_side_is_relative_to_the_gland() -> None:
    ph = make_gland_case("p", 5, 2)
    lab = ph.labels["lesions"].data
    aff = ph.labels["lesions"].affine
    gland = ph.labels["gland"].data > 0
    cx = (np.argwhere(gland) @ aff[:3, :3].T + aff[:3, 3])[:, 0].mean()
    for les in ph.truth["lesions"]:
        x = (np.argwhere(lab == les["label"]) @ aff[:3, :3].T + aff[:3, 3])[:, 0].mean()
        assert les["side"] == ("R" if x > cx else "L")


def test_brats_affine_side_and_shares() -> None:
    """A BraTS-affine case: every voxel has world x <= 0, yet the tumour placed on the patient's
    right is 'right' (its right share from the written mask and the head's midline)."""
    ph = make_tumour_case("b", 0, "single", "right", orientation="brats")
    aff = ph.sequences["T1"].affine
    assert np.allclose(np.diag(aff)[:3] / abs(aff[0, 0]), [-1, -1, 1]) and np.allclose(aff[:3, 3], [0, 239, 0])
    seg = ph.labels["seg"].data > 0
    world = np.argwhere(seg) @ aff[:3, :3].T + aff[:3, 3]
    assert (world[:, 0] < 0).all()
    assert ph.truth["side"] == "right"
    share = float((world[:, 0] > ph.truth["midline_world_x"]).mean())
    assert abs(share - ph.truth["right_share"]) < 0.05  # the head's yaw is at most 5 degrees


@pytest.mark.parametrize("kind,side,want", [("single", "left", "left"), ("midline", "left", "bilateral")])
def test_tumour_sides_on_other_grids(kind: str, side: str, want: str) -> None:
    ph = make_tumour_case("b", 2, kind, side)
    assert ph.truth["side"] == want
    if want == "bilateral":
        assert 0.1 < ph.truth["right_share"] < 0.9


def test_multifocal_has_two_foci_and_brats_labels() -> None:
    ph = make_tumour_case("b", 4, "multifocal", "left")
    seg = ph.labels["seg"].data
    assert ph.truth["n_foci"] >= 2 and ph.truth["multifocal"]
    assert set(np.unique(seg)) <= {0, 1, 2, 4} and 4 in seg
    for k in ("1", "2", "4"):
        assert ph.truth["volumes_ml"][k] == pytest.approx((seg == int(k)).sum() * ph.truth["voxel_ml"])
    lgg = make_tumour_case("b", 4, "single", "left", grade="LGG").labels["seg"].data
    assert 4 not in lgg and 1 in lgg


def test_brain_cases_read_back_with_truth(written) -> None:
    for case in written["brain_report"]:
        assert set(case.sequences) == {"T1", "T1c", "T2", "FLAIR"}
        seg = _truth_ref(case, "seg")
        wt = (np.asarray(seg.dataobj) > 0).sum() * _voxel_ml(seg)
        assert case.ground_truth["values"]["WT_ml"] == pytest.approx(wt, rel=1e-6)


def test_thick_slices_mix_tissues() -> None:
    """Partial voluming: a voxel whose slice straddles a boundary gets the mean intensity."""
    aff = np.diag([1.0, 1.0, 4.0, 1.0])
    grid = Grid((2, 2, 3), aff)
    img, lab = render(grid, lambda p: (p[:, 2] > 4.5).astype(np.int16), {0: 0.0, 1: 1.0}, thickness_vox=1.0)
    assert lab[0, 0].tolist() == [0, 0, 1]
    assert img[0, 0, 1] == pytest.approx(1 / 3) and img[0, 0, 2] == 1.0


def test_same_seed_same_case() -> None:
    a, b = make_gland_case("p", 8, 1), make_gland_case("p", 8, 1)
    assert np.array_equal(a.sequences["T2w"].data, b.sequences["T2w"].data)
    assert json.dumps(a.truth, default=str) == json.dumps(b.truth, default=str)
    assert set(TASK_LAYOUT) == {"cardiac_report", "prostate_report", "brain_report"}
