"""Plausibility checks on hand-made deliverables with known answers (no Ray): each check
passes a plausible file, fails an implausible one with its value, and never raises on a bad
file. The engine path (cases built to be wrong end ``implausible``) is in
``test_plausibility_engine.py``."""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage
from pydantic import ValidationError

from bcer.contracts import (Case, ErrorCode, PlausibilityCheck, SequenceRef, TaskContract, ToolError, list_contracts,
                            load_contract)
from bcer.engine.plausibility import CHECKS, resolve, run_check, run_checks, summary_message

AFF = np.diag([1.5, 1.5, 3.0, 1.0])  # 1.5 x 1.5 x 3 mm: 6.75 uL voxels


def nii(path: Path, data: np.ndarray, affine: np.ndarray = AFF) -> Path:
    data = np.asarray(data)
    nib.save(nib.Nifti1Image(data.astype(np.int16) if data.dtype == bool else data, affine), str(path))
    return path


def js(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def ball(shape, centre, radius_vox) -> np.ndarray:
    g = np.indices(shape).astype(float)
    r = np.asarray(radius_vox, float).reshape(3, 1, 1, 1)
    return (((g - np.asarray(centre, float).reshape(3, 1, 1, 1)) / r) ** 2).sum(0) <= 1


def case(tmp: Path, **meta) -> Case:
    return Case(id="c1", root=str(tmp), sequences={}, metadata=meta)


def run(name: str, tmp: Path, files: dict[str, Path], deliverable: str, c: Case | None = None,
        uses: dict[str, str] | None = None, **params):
    spec = PlausibilityCheck(check=name, deliverable=deliverable, uses=uses or {}, params=params)
    return run_check(spec, c or case(tmp), tmp, files)


# ---- prostate -------------------------------------------------------------------------------

@pytest.fixture
def gland(tmp_path) -> tuple[Path, np.ndarray]:
    shape = (96, 96, 24)
    m = ball(shape, (48, 48, 12), (14, 12, 6)).astype(np.int16)  # ~ 4/3 pi 21x18x18 mm = 28.5 mL
    return nii(tmp_path / "gland.nii.gz", m), m


def test_gland_volume_in_range_and_whole_fov_out(tmp_path, gland) -> None:
    path, m = gland
    r = run("gland_volume", tmp_path, {"gland": path}, "gland")
    assert r.ok and r.value == pytest.approx(m.sum() * 1.5 * 1.5 * 3 / 1000) and 20 < r.value < 40
    whole = nii(tmp_path / "pelvis.nii.gz", np.ones(m.shape, np.int16))
    r = run("gland_volume", tmp_path, {"gland": whole}, "gland")
    assert r.ok is False and r.value == pytest.approx(96 * 96 * 24 * 6.75e-3) and "outside 10–250 mL" in r.message
    tiny = nii(tmp_path / "tiny.nii.gz", ball(m.shape, (48, 48, 12), (3, 3, 1)).astype(np.int16))
    assert run("gland_volume", tmp_path, {"gland": tiny}, "gland").ok is False
    assert run("gland_volume", tmp_path, {"gland": tiny}, "gland", min_ml=0.01).ok  # contract may override


def test_organ_off_edge(tmp_path, gland) -> None:
    path, m = gland
    assert run("organ_off_edge", tmp_path, {"gland": path}, "gland").ok
    leak = m.copy()
    leak[40:56, 0:50, 10:14] = 1  # a tongue into the surroundings that reaches the in-plane border
    r = run("organ_off_edge", tmp_path, {"gland": nii(tmp_path / "leak.nii.gz", leak)}, "gland")
    assert r.ok is False and r.value > 0.005
    through = m.copy()
    through[44:52, 44:52, :] = 1  # first/last slice (the coarse axis) are not an in-plane edge
    assert run("organ_off_edge", tmp_path, {"gland": nii(tmp_path / "t.nii.gz", through)}, "gland").ok


def _lesion(lid: str, lo, hi, size_mm: float, volume_ml: float, affine=AFF) -> dict:
    lo, hi = np.asarray(lo), np.asarray(hi)
    world = [(affine[:3, :3] @ lo + affine[:3, 3]).tolist(), (affine[:3, :3] @ (hi - 1) + affine[:3, 3]).tolist()]
    return {"id": lid, "label": "lesion", "box_voxel": [lo.tolist(), hi.tolist()], "box_world": world,
            "volume_ml": volume_ml, "side": "R", "zone": "PZ", "attributes": {"size_mm": size_mm, "adc": 700.0}}


def _findings(tmp: Path, items: list[dict], affine=AFF) -> Path:
    return js(tmp / "lesions.json", {"kind": "findings", "items": items, "affine": np.asarray(affine).tolist()})


def test_lesions_inside_the_gland_pass_outside_fail(tmp_path, gland) -> None:
    path, _ = gland
    inside = _findings(tmp_path, [_lesion("l1", (40, 40, 10), (46, 46, 13), 9.0, 0.3)])
    files = {"gland": path, "findings": inside}
    r = run("lesions_in_gland", tmp_path, files, "findings", uses={"gland": "gland"})
    assert r.ok and r.value == 1.0
    outside = _findings(tmp_path, [_lesion("l1", (40, 40, 10), (46, 46, 13), 9.0, 0.3),
                                   _lesion("l2", (5, 5, 10), (12, 12, 13), 10.0, 0.4)])
    r = run("lesions_in_gland", tmp_path, {**files, "findings": outside}, "findings", uses={"gland": "gland"})
    assert r.ok is False and r.value == 0.0 and "l2" in r.message and "outside the gland" in r.message
    beyond = _findings(tmp_path, [_lesion("l3", (80, 40, 10), (101, 60, 13), 40.0, 2.0)])
    r = run("lesions_in_gland", tmp_path, {**files, "findings": beyond}, "findings", uses={"gland": "gland"})
    assert r.ok is False and "outside the image" in r.message
    none = _findings(tmp_path, [])
    assert run("lesions_in_gland", tmp_path, {**files, "findings": none}, "findings", uses={"gland": "gland"}).ok


def test_lesion_boxes_on_another_grid_are_mapped_through_world(tmp_path, gland) -> None:
    """A detector reporting boxes on the ADC grid (3 mm voxels, shifted): box_world decides."""
    path, _ = gland
    adc_aff = np.diag([3.0, 3.0, 3.0, 1.0])
    adc_aff[:3, 3] = [-12.0, -9.0, 0.0]
    # gland centre (48, 48, 12) on the T2w grid = world (72, 72, 36) = ADC voxel (28, 27, 12)
    item = _lesion("l1", (26, 25, 11), (30, 29, 13), 9.0, 0.3, affine=adc_aff)
    f = _findings(tmp_path, [item], affine=adc_aff)
    assert run("lesions_in_gland", tmp_path, {"gland": path, "findings": f}, "findings", uses={"gland": "gland"}).ok
    far = _lesion("l1", (2, 2, 11), (6, 6, 13), 9.0, 0.3, affine=adc_aff)
    f = _findings(tmp_path, [far], affine=adc_aff)
    r = run("lesions_in_gland", tmp_path, {"gland": path, "findings": f}, "findings", uses={"gland": "gland"})
    assert r.ok is False


def test_a_lesion_larger_than_its_gland_is_implausible(tmp_path, gland) -> None:
    path, m = gland
    gland_ml = m.sum() * 6.75e-3
    small = _findings(tmp_path, [_lesion("l1", (40, 40, 10), (46, 46, 13), 9.0, 0.3)])
    r = run("lesions_smaller_than_gland", tmp_path, {"gland": path, "findings": small}, "findings",
            uses={"gland": "gland"})
    assert r.ok and r.value == pytest.approx(0.3 / gland_ml)
    huge = _findings(tmp_path, [_lesion("l1", (20, 20, 2), (80, 80, 22), 76.0, 2 * gland_ml)])
    r = run("lesions_smaller_than_gland", tmp_path, {"gland": path, "findings": huge}, "findings",
            uses={"gland": "gland"})
    assert r.ok is False and r.value == pytest.approx(2.0) and "76 mm" in r.message


def _pirads(tmp: Path, label: str, lesions: list[tuple[str, int]]) -> Path:
    return js(tmp / "pirads.json", {"kind": "classification", "label": label,
                                    "scores": {i: float(c) for i, c in lesions},
                                    "meta": {"lesions": [{"id": i, "category": c} for i, c in lesions]}})


@pytest.mark.parametrize("label,lesions,items,ok,why", [
    ("PI-RADS 4", [("l1", 4)], [("l1", 9.0)], True, ""),
    ("PI-RADS 5", [("l1", 5)], [("l1", 18.0)], True, ""),
    ("PI-RADS 5", [("l1", 5)], [("l1", 9.0)], False, "without a lesion ≥ 15 mm"),
    ("PI-RADS 1", [], [], True, ""),
    ("PI-RADS 3", [], [], False, "with no lesion"),
    ("PI-RADS 3", [("l1", 4)], [("l1", 9.0)], False, "highest lesion category 4"),
    ("PI-RADS 4", [("l9", 4)], [("l1", 9.0)], False, "not in the findings"),
    ("grade 4", [("l1", 4)], [("l1", 9.0)], False, "not a PI-RADS category"),
])
def test_pirads_consistent_with_the_lesion_list(tmp_path, label, lesions, items, ok, why) -> None:
    f = _findings(tmp_path, [_lesion(i, (40, 40, 10), (46, 46, 13), s, 0.3) for i, s in items])
    r = run("pirads_consistent", tmp_path, {"pirads": _pirads(tmp_path, label, lesions), "findings": f}, "pirads",
            uses={"findings": "findings"})
    assert r.ok is ok and why in r.message


# ---- cardiac ------------------------------------------------------------------------------

def _function(tmp: Path, **row) -> Path:
    base = {"ed_frame": 1, "es_frame": 5, "lv_edv_ml": 130.0, "lv_esv_ml": 50.0, "lv_ef_pct": 61.5,
            "rv_edv_ml": 140.0, "rv_esv_ml": 55.0, "rv_ef_pct": 60.7}
    base.update(row)
    js(tmp / "function.csv", {})  # the primary file may be the CSV: checks read the JSON beside it
    return js(tmp / "function.json", {"kind": "table", "rows": [base]})


def _phases(tmp: Path, **row) -> Path:
    base = {"ed_frame": 1, "es_frame": 5, "n_frames": 12, "lv_volume_ed_ml": 130.0, "lv_volume_es_ml": 50.0,
            "lv_volume_curve_ml": [120.0] * 12, "rv_volume_curve_ml": [130.0] * 12}
    base.update(row)
    return js(tmp / "phases.json", {"kind": "table", "rows": [base]})


def test_ef_and_edv_ranges(tmp_path) -> None:
    assert run("ef_range", tmp_path, {"function": _function(tmp_path)}, "function").ok
    r = run("ef_range", tmp_path, {"function": _function(tmp_path, lv_ef_pct=120.0)}, "function")
    assert r.ok is False and r.value == 120.0 and r.limit == "5–90 %" and "lv_ef_pct = 120 %" in r.message
    assert run("ef_range", tmp_path, {"function": _function(tmp_path, rv_ef_pct=2.0)}, "function").ok is False
    assert run("edv_range", tmp_path, {"function": _function(tmp_path)}, "function").ok
    r = run("edv_range", tmp_path, {"function": _function(tmp_path, lv_edv_ml=4.0)}, "function")
    assert r.ok is False and r.value == 4.0
    r = run("ef_range", tmp_path, {"function": _function(tmp_path, lv_ef_pct=float("nan"))}, "function")
    assert r.ok is False and "not a finite number" in r.message


def test_ed_must_exceed_es(tmp_path) -> None:
    files = {"function": _function(tmp_path), "phases": _phases(tmp_path)}
    r = run("ed_greater_than_es", tmp_path, files, "function", uses={"phases": "phases"})
    assert r.ok and r.value == pytest.approx(80.0)
    swapped = _function(tmp_path, lv_edv_ml=50.0, lv_esv_ml=130.0)
    r = run("ed_greater_than_es", tmp_path, {**files, "function": swapped}, "function", uses={"phases": "phases"})
    assert r.ok is False and r.value == pytest.approx(-80.0) and "LV" in r.message
    r = run("ed_greater_than_es", tmp_path, {**files, "phases": _phases(tmp_path, lv_volume_es_ml=140.0)},
            "function", uses={"phases": "phases"})
    assert r.ok is False and "LV (phases)" in r.message


def test_phases_consistent(tmp_path) -> None:
    files = {"function": _function(tmp_path), "phases": _phases(tmp_path)}
    assert run("phases_consistent", tmp_path, files, "phases", uses={"function": "function"}).ok
    r = run("phases_consistent", tmp_path, {**files, "phases": _phases(tmp_path, es_frame=1)}, "phases")
    assert r.ok is False and "same frame" in r.message
    r = run("phases_consistent", tmp_path, {**files, "phases": _phases(tmp_path, es_frame=12)}, "phases")
    assert r.ok is False and "outside 0..11" in r.message
    files = {"function": _function(tmp_path, es_frame=6), "phases": _phases(tmp_path)}
    r = run("phases_consistent", tmp_path, files, "phases",
            uses={"function": "function"})
    assert r.ok is False and "≠ phases es_frame 5" in r.message


def test_volumes_match_the_label_cine(tmp_path) -> None:
    seg = np.zeros((20, 20, 4, 6), np.int16)
    seg[2:12, 2:12, :, 1] = 3  # LV at ED: 400 voxels x 6.75 uL = 2.7 mL
    seg[4:9, 4:9, :, 4] = 3    # LV at ES: 100 voxels = 0.675 mL
    seg[14:18, 2:10, :, 1] = 1
    seg[14:16, 2:10, :, 4] = 1
    files = {"seg": nii(tmp_path / "seg.nii.gz", seg),
             "function": _function(tmp_path, ed_frame=1, es_frame=4, lv_edv_ml=2.7, lv_esv_ml=0.675,
                                   rv_edv_ml=0.864, rv_esv_ml=0.432)}
    r = run("volumes_match_seg", tmp_path, files, "function", uses={"seg": "seg"})
    assert r.ok and r.value < 1e-6
    files["function"] = _function(tmp_path, ed_frame=1, es_frame=4, lv_edv_ml=5.4, lv_esv_ml=0.675,
                                  rv_edv_ml=0.864, rv_esv_ml=0.432)
    r = run("volumes_match_seg", tmp_path, files, "function", uses={"seg": "seg"})
    assert r.ok is False and r.value == pytest.approx(1.0) and "lv_edv_ml" in r.message


def _heart(shape=(28, 28, 3, 4)) -> tuple[np.ndarray, np.ndarray]:
    """A bright-blood cine and its labels: LV disc ringed by MYO, an RV beside it (beating)."""
    g = np.indices(shape[:2]).astype(float)
    lab = np.zeros(shape, np.int16)
    for t in range(shape[3]):
        r_lv = 6.0 - t  # the cavity shrinks over the frames
        d = np.hypot(g[0] - 12, g[1] - 12)
        rv = np.hypot(g[0] - 12, g[1] - 22) <= 4
        sl = np.where(d <= r_lv, 3, np.where(d <= 9, 2, np.where(rv, 1, 0)))
        lab[..., t] = sl[..., None]
    level = np.choose(lab, [0.1, 0.9, 0.3, 1.0])
    rng = np.random.default_rng(0)
    return (level + rng.normal(0, 0.03, shape)).astype(np.float32), lab


def test_labels_match_the_cine(tmp_path) -> None:
    img, lab = _heart()
    cine = nii(tmp_path / "cine.nii.gz", img)
    c = Case(id="h1", root=str(tmp_path), sequences={"CINE": SequenceRef(path=str(cine), kind="cine")})
    r = run("labels_match_cine", tmp_path, {"seg": nii(tmp_path / "seg.nii.gz", lab)}, "seg", c)
    assert r.ok and r.value == 0.0 and "LV rim MYO 100 %" in r.message
    eroded = lab.copy()  # the cavity drawn two voxels too small, its blood given to the wall
    for t in range(lab.shape[3]):
        g = np.indices(lab.shape[:2]).astype(float)
        rim = (np.hypot(g[0] - 12, g[1] - 12) > 4.0 - t) & (lab[..., 0, t] == 3)
        eroded[rim, :, t] = 2
    r = run("labels_match_cine", tmp_path, {"seg": nii(tmp_path / "ero.nii.gz", eroded)}, "seg", c)
    assert r.ok is False and r.value > 0.15 and "as bright as blood" in r.message
    swapped = np.where(lab == 3, 1, np.where(lab == 1, 3, lab)).astype(np.int16)  # LV drawn on the RV
    r = run("labels_match_cine", tmp_path, {"seg": nii(tmp_path / "sw.nii.gz", swapped)}, "seg", c)
    assert r.ok is False and "rim is myocardium" in r.message
    dark = np.where(lab == 2, 3, np.where(lab == 3, 2, lab)).astype(np.int16)  # LV and MYO exchanged
    r = run("labels_match_cine", tmp_path, {"seg": nii(tmp_path / "dk.nii.gz", dark)}, "seg", c)
    assert r.ok is False and "not brighter than the myocardium" in r.message
    r = run("labels_match_cine", tmp_path, {"seg": nii(tmp_path / "off.nii.gz", lab[2:])}, "seg", c)
    assert r.ok is False and "not on the cine's grid" in r.message
    ks = Case(id="h2", root=str(tmp_path), sequences={"KSPACE": SequenceRef(path=str(cine))})
    r = run("labels_match_cine", tmp_path, {"seg": tmp_path / "seg.nii.gz"}, "seg", ks)
    assert r.ok is None and "not applicable" in r.message  # k-space input: no cine deliverable to judge against


def test_cavities_in_every_frame(tmp_path) -> None:
    _, lab = _heart()  # LV radius 6, 5, 4, 3: the smallest frame is (3/6)^2 ~ 25 % of the largest
    r = run("cavities_every_frame", tmp_path, {"seg": nii(tmp_path / "seg.nii.gz", lab)}, "seg")
    counts = np.count_nonzero(lab == 3, axis=(0, 1, 2))
    assert r.ok and r.value == pytest.approx(counts.min() / counts.max())
    lost = lab.copy()
    lost[..., 2][lost[..., 2] == 3] = 0  # frame 2 lost its LV, ED (0) and ES (3) untouched
    r = run("cavities_every_frame", tmp_path, {"seg": nii(tmp_path / "lost.nii.gz", lost)}, "seg")
    assert r.ok is False and r.value == 0.0 and "LV in frame(s) [2] is 0 % of its largest frame (0)" in r.message
    no_rv = np.where(lab == 1, 0, lab).astype(np.int16)
    r = run("cavities_every_frame", tmp_path, {"seg": nii(tmp_path / "norv.nii.gz", no_rv)}, "seg")
    assert r.ok is False and "no RV in any frame" in r.message
    r = run("cavities_every_frame", tmp_path, {"seg": nii(tmp_path / "3d.nii.gz", lab[..., 0])}, "seg")
    assert r.ok is None and "not applicable" in r.message


# ---- brain --------------------------------------------------------------------------------

@pytest.fixture
def brain(tmp_path) -> tuple[Case, np.ndarray]:
    shape = (48, 56, 40)
    head = ball(shape, (24, 28, 20), (20, 24, 14))
    t1 = np.where(head, 600.0, 0.0).astype(np.float32)  # skull-stripped: background exactly 0
    aff = np.diag([3.0, 3.0, 3.0, 1.0])
    path = nii(tmp_path / "t1.nii.gz", t1, aff)
    return Case(id="b1", root=str(tmp_path), sequences={"T1": SequenceRef(path=str(path))}), head


def _labels(shape, centre) -> np.ndarray:
    lab = np.zeros(shape, np.int16)
    lab[ball(shape, centre, (6, 6, 5))] = 2
    lab[ball(shape, centre, (4, 4, 3))] = 4
    lab[ball(shape, centre, (2, 2, 2))] = 1
    return lab


def test_tumour_inside_the_brain(tmp_path, brain) -> None:
    c, head = brain
    aff = np.diag([3.0, 3.0, 3.0, 1.0])
    ok = nii(tmp_path / "seg.nii.gz", _labels(head.shape, (18, 28, 20)), aff)
    r = run("tumour_in_brain", tmp_path, {"seg": ok}, "seg", c=c)
    assert r.ok and r.value == 1.0
    out = nii(tmp_path / "out.nii.gz", _labels(head.shape, (40, 50, 20)), aff)  # in the corner, off the brain
    r = run("tumour_in_brain", tmp_path, {"seg": out}, "seg", c=c)
    assert r.ok is False and r.value < 0.5 and "inside the brain" in r.message
    everything = nii(tmp_path / "all.nii.gz", head.astype(np.int16) * 2, aff)
    r = run("tumour_in_brain", tmp_path, {"seg": everything}, "seg", c=c)
    assert r.ok is False and "% of the" in r.message  # 100 % of the brain is no tumour


def test_brain_margin_and_inputs_that_are_not_skull_stripped(tmp_path) -> None:
    from bcer.engine.plausibility.brain import brain_mask, inside_mask
    from bcer.engine.plausibility.core import Volume

    shape, aff = (40, 40, 30), np.diag([2.0, 2.0, 2.0, 1.0])
    head = ball(shape, (20, 20, 15), (12, 12, 10))
    rng = np.random.default_rng(3)
    t1 = np.where(head, 600.0, 20.0) + rng.normal(0, 5, shape)  # noisy background, no zeros
    mask, how = brain_mask(Volume(t1, aff))
    assert "not skull-stripped" in how and mask.sum() == pytest.approx(head.sum(), rel=0.02)
    # points 1 voxel (2 mm) and 4 voxels (8 mm) beyond the edge along x; a 2 mm margin is 1 voxel
    edge = np.array([[2.0 * (20 + 12 + 1), 40.0, 30.0], [2.0 * (20 + 12 + 4), 40.0, 30.0], [-50.0, 0.0, 0.0]])
    assert inside_mask(mask, aff, edge, 0).tolist() == [False, False, False]
    assert inside_mask(mask, aff, edge, 1).tolist() == [True, False, False]
    case_ = Case(id="h1", root=str(tmp_path), sequences={"T1": SequenceRef(path=str(nii(tmp_path / "t1.nii.gz",
                                                                                          t1.astype(np.float32), aff)))})
    seg = nii(tmp_path / "seg.nii.gz", _labels(shape, (20, 20, 15)), aff)
    assert run("tumour_in_brain", tmp_path, {"seg": seg}, "seg", c=case_).ok


def test_tumour_in_the_scalp_of_a_head_that_was_not_skull_stripped_fails(tmp_path) -> None:
    """On a head with its skull (an independent-family case), the brain is the region inside
    the bone shell, read from all four contrasts: a label map in the scalp fails, the true
    tumour passes. With the head mask as the brain (the old rule) the scalp passed."""
    from bcer.datasets.independent import make_tumour_case
    from bcer.engine.plausibility.brain import brain_mask
    from bcer.engine.plausibility.core import Volume

    ph = make_tumour_case("ind007", 7, "multifocal", "right", "HGG")
    aff = np.asarray(ph.sequences["T1"].affine)
    seqs = {k: SequenceRef(path=str(nii(tmp_path / f"{k}.nii.gz", np.asarray(ph.sequences[k].data, np.float32), aff)))
            for k in ("T1", "T1c", "T2", "FLAIR")}
    c = Case(id="ind007", root=str(tmp_path), sequences=seqs)
    truth, brain = np.asarray(ph.labels["seg"].data), np.asarray(ph.labels["brain"].data) > 0
    t1 = np.asarray(ph.sequences["T1"].data)
    head = t1 > 0.1 * np.percentile(t1, 99)
    scalp = head & ~ndimage.binary_dilation(brain, iterations=4)  # scalp and bone, well clear of the brain
    scalp &= np.indices(t1.shape)[0] < np.percentile(np.argwhere(scalp)[:, 0], 25)  # one side of it
    wrong = nii(tmp_path / "scalp.nii.gz", np.where(scalp, 4, 0).astype(np.int16), aff)
    right = nii(tmp_path / "seg.nii.gz", truth.astype(np.int16), aff)
    assert run("tumour_in_brain", tmp_path, {"seg": right}, "seg", c=c).ok
    bad = run("tumour_in_brain", tmp_path, {"seg": wrong}, "seg", c=c)
    assert not bad.ok and "bone shell" in bad.message
    vols = [Volume(np.asarray(ph.sequences[k].data), aff) for k in ("T1", "T1c", "T2", "FLAIR")]
    stripped = Volume(np.where(brain, np.asarray(ph.sequences["T1"].data), 0.0), aff)
    assert brain_mask(stripped, lambda: pytest.fail("a skull-stripped input needs no other contrast"))[0].any()
    mask, how = brain_mask(vols[0], lambda: vols)
    assert "4 contrast" in how and not (mask & scalp).any()
    old = ndimage.binary_fill_holes(head)
    assert old[scalp].all()  # the old rule's brain held every scalp voxel


def test_tumour_in_brain_from_feature_centroids(tmp_path, brain) -> None:
    c, _ = brain
    rows = [{"roi": "oedema", "labels": [2], "volume_ml": 20.0, "centroid_x": 54.0, "centroid_y": 84.0,
             "centroid_z": 60.0}]
    f = js(tmp_path / "features.json", {"kind": "table", "rows": rows})
    assert run("tumour_in_brain", tmp_path, {"features": f}, "features", c=c).ok
    rows[0].update(centroid_x=140.0, centroid_y=160.0)
    f = js(tmp_path / "features.json", {"kind": "table", "rows": rows})
    r = run("tumour_in_brain", tmp_path, {"features": f}, "features", c=c)
    assert r.ok is False and r.value == 0.0
    # quant.roi_features 1.1: side "bilateral", foci; a focus outside the brain fails the check
    rows[0].update(centroid_x=54.0, centroid_y=84.0, side="bilateral", n_foci=2, multifocal=True)
    foci = [{"focus": 1, "centroid_x": 54.0, "centroid_y": 84.0, "centroid_z": 60.0, "side": "L"},
            {"focus": 2, "centroid_x": 140.0, "centroid_y": 160.0, "centroid_z": 60.0, "side": "R"}]
    meta = {"whole": {"side": "bilateral", "multifocal": True, "foci": foci}}
    f = js(tmp_path / "features.json", {"kind": "table", "rows": rows, "meta": meta})
    r = run("tumour_in_brain", tmp_path, {"features": f}, "features", c=c)
    assert r.ok is False and r.value == pytest.approx(2 / 3) and "of 3 ROI centroids" in r.message  # row + 2 foci
    foci[1].update(centroid_x=90.0, centroid_y=84.0)
    f = js(tmp_path / "features.json", {"kind": "table", "rows": rows, "meta": meta})
    assert run("tumour_in_brain", tmp_path, {"features": f}, "features", c=c).ok


def test_brats_labels_and_nested_compartments(tmp_path, brain) -> None:
    c, head = brain
    lab = _labels(head.shape, (18, 28, 20))
    files = {"labels": nii(tmp_path / "seg.nii.gz", lab), "whole_tumour": nii(tmp_path / "wt.nii.gz", lab > 0)}
    assert run("brats_labels", tmp_path, files, "labels").ok
    bad = lab.copy()
    bad[bad == 4] = 3
    r = run("brats_labels", tmp_path, {"labels": nii(tmp_path / "bad.nii.gz", bad)}, "labels")
    assert r.ok is False and r.value == float((lab == 4).sum()) and "[3]" in r.message
    r = run("compartments_nested", tmp_path, files, "whole_tumour", uses={"labels": "labels"})
    assert r.ok and r.value == 1.0
    files["whole_tumour"] = nii(tmp_path / "wt2.nii.gz", lab == 2)  # WT without the core
    r = run("compartments_nested", tmp_path, files, "whole_tumour", uses={"labels": "labels"})
    assert r.ok is False and "not nested" in r.message


def test_volumes_agree_between_map_table_and_grade(tmp_path, brain) -> None:
    c, head = brain
    lab = _labels(head.shape, (18, 28, 20))
    vox = 27e-3
    vols = {k: float((lab == k).sum()) * vox for k in (1, 2, 4)}
    rows = [{"roi": n, "labels": [k], "volume_ml": vols[k]} for n, k in (("ncr", 1), ("ed", 2), ("et", 4))]
    files = {"seg": nii(tmp_path / "seg.nii.gz", lab, np.diag([3.0, 3.0, 3.0, 1.0])),
             "features": js(tmp_path / "features.json", {"kind": "table", "rows": rows}),
             "grade": js(tmp_path / "grade.json", {"label": "HGG", "scores": {
                 "whole_tumour_ml": sum(vols.values()), "enhancing_ml": vols[4]}})}
    assert run("compartment_volumes", tmp_path, files, "features", uses={"labels": "seg"}).ok
    assert run("grade_matches_features", tmp_path, files, "grade", uses={"features": "features"}).ok
    rows[1]["volume_ml"] *= 3
    files["features"] = js(tmp_path / "features.json", {"kind": "table", "rows": rows})
    r = run("compartment_volumes", tmp_path, files, "features", uses={"labels": "seg"})
    assert r.ok is False and r.value == pytest.approx(2.0) and "label 2" in r.message
    assert run("grade_matches_features", tmp_path, files, "grade", uses={"features": "features"}).ok is False
    files["grade"] = js(tmp_path / "grade.json", {"label": "GBM"})
    r = run("grade_matches_features", tmp_path, files, "grade", uses={"features": "features"})
    assert r.ok is False and "not HGG or LGG" in r.message


# ---- images, recon, registration ------------------------------------------------------------

def test_recon_matrix_against_case_metadata(tmp_path) -> None:
    img = nii(tmp_path / "recon.nii.gz", np.random.default_rng(0).random((176, 176, 4)).astype(np.float32))
    assert run("recon_matrix", tmp_path, {"recon": img}, "recon").ok is None  # no header matrix: n/a
    for meta in ([176, 176, 1], {"x": 176, "y": 176, "z": 1}):
        assert run("recon_matrix", tmp_path, {"recon": img}, "recon", c=case(tmp_path, recon_matrix=meta)).ok
    wrong = nii(tmp_path / "wide.nii.gz", np.ones((352, 200, 4), np.float32))
    r = run("recon_matrix", tmp_path, {"recon": wrong}, "recon", c=case(tmp_path, recon_matrix=[176, 176, 1]))
    assert r.ok is False and r.limit == "176×176" and "352×200" in r.message and r.value == pytest.approx(2.27, abs=0.01)
    rect = nii(tmp_path / "rect.nii.gz", np.ones((200, 176, 2), np.float32))
    assert run("recon_matrix", tmp_path, {"recon": rect}, "recon", c=case(tmp_path, recon_matrix=[176, 200])).ok


def test_finite_image(tmp_path) -> None:
    data = np.random.default_rng(1).random((8, 8, 8)).astype(np.float32)
    assert run("finite_image", tmp_path, {"im": nii(tmp_path / "a.nii.gz", data)}, "im").ok
    data[0, 0, 0] = np.nan
    r = run("finite_image", tmp_path, {"im": nii(tmp_path / "b.nii.gz", data)}, "im")
    assert r.ok is False and r.value == 1.0
    r = run("finite_image", tmp_path, {"im": nii(tmp_path / "c.nii.gz", np.full((8, 8, 8), 3.0, np.float32))}, "im")
    assert r.ok is False and "constant" in r.message


def test_similar_to_input(tmp_path, brain) -> None:
    c, head = brain
    rng = np.random.default_rng(2)
    t1 = np.asarray(nib.load(c.sequences["T1"].path).dataobj)
    same = nii(tmp_path / "den.nii.gz", t1 + rng.normal(0, 30, t1.shape).astype(np.float32),
               np.diag([3.0, 3.0, 3.0, 1.0]))
    r = run("similar_to_input", tmp_path, {"im": same}, "im", c=c)
    assert r.ok and r.value > 0.9
    fine = np.diag([1.5, 1.5, 1.5, 1.0])  # a 2x finer grid of the same field of view
    up = np.repeat(np.repeat(np.repeat(t1, 2, 0), 2, 1), 2, 2)
    fine[:3, 3] = -0.75  # voxel centres of the fine grid around the coarse ones
    assert run("similar_to_input", tmp_path, {"im": nii(tmp_path / "up.nii.gz", up, fine)}, "im", c=c).ok
    other = nii(tmp_path / "other.nii.gz", rng.random(t1.shape).astype(np.float32), np.diag([3.0, 3.0, 3.0, 1.0]))
    r = run("similar_to_input", tmp_path, {"im": other}, "im", c=c)
    assert r.ok is False and abs(r.value) < 0.1


def _transform(tmp: Path, rot_deg: float = 0.0, shift=(0.0, 0.0, 0.0), scale: float = 1.0) -> Path:
    t = np.radians(rot_deg)
    m = np.eye(4)
    m[:3, :3] = scale * np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
    m[:3, 3] = shift
    return js(tmp / "transform.json", {"kind": "transform", "type": "rigid", "matrix": m.tolist()})


def test_registration_limits(tmp_path) -> None:
    grid = nii(tmp_path / "adc_on_t2w.nii.gz", np.ones((11, 11, 11), np.float32), np.diag([2.0, 2.0, 2.0, 1.0]))
    files = {"grid": grid}
    # centre of the grid: world (10, 10, 10); a 3 deg turn about the origin moves it ~0.74 mm
    files["transform"] = _transform(tmp_path, 3.0, (1.0, 0.0, 0.0))
    rot = run("registration_rotation", tmp_path, files, "transform")
    tr = run("registration_translation", tmp_path, files, "transform", uses={"grid": "grid"})
    assert rot.ok and rot.value == pytest.approx(3.0) and tr.ok and tr.value < 2.0
    files["transform"] = _transform(tmp_path, 20.0)
    r = run("registration_rotation", tmp_path, files, "transform")
    assert r.ok is False and r.value == pytest.approx(20.0) and r.limit == "≤ 10°"
    files["transform"] = _transform(tmp_path, 0.0, (0.0, 30.0, 0.0))
    r = run("registration_translation", tmp_path, files, "transform", uses={"grid": "grid"})
    assert r.ok is False and r.value == pytest.approx(30.0)
    files["transform"] = _transform(tmp_path, 0.0, scale=1.2)
    r = run("registration_rotation", tmp_path, files, "transform")
    assert r.ok is False and "not a rigid rotation" in r.message


# ---- robustness and contracts ---------------------------------------------------------------

def test_a_bad_file_is_a_failed_check_never_a_crash(tmp_path, gland) -> None:
    garbage = tmp_path / "garbage.nii.gz"
    garbage.write_bytes(b"\x1f\x8b not really gzip")
    r = run("gland_volume", tmp_path, {"gland": garbage}, "gland")
    assert r.ok is False and r.message.startswith("cannot evaluate: cannot read garbage.nii.gz")
    r = run("gland_volume", tmp_path, {"gland": tmp_path / "missing.nii.gz"}, "gland")
    assert r.ok is False and "was not written" in r.message
    (tmp_path / "bad.json").write_text("{not json")
    r = run("ef_range", tmp_path, {"function": tmp_path / "bad.json"}, "function")
    assert r.ok is False and "cannot read bad.json" in r.message
    r = run("ef_range", tmp_path, {"function": js(tmp_path / "list.json", [1, 2])}, "function")
    assert r.ok is False and "not a JSON object" in r.message
    r = run("ef_range", tmp_path, {"function": js(tmp_path / "norows.json", {"rows": []})}, "function")
    assert r.ok is False and "no rows" in r.message
    path, _ = gland  # a 3-D mask given where a label cine is needed
    r = run("volumes_match_seg", tmp_path, {"function": _function(tmp_path), "seg": path}, "function",
            uses={"seg": "seg"})
    assert r.ok is False and "label cine" in r.message


def test_unknown_checks_and_params_are_schema_errors(tmp_path) -> None:
    with pytest.raises(ToolError) as e:
        resolve(PlausibilityCheck(check="gland_volum", deliverable="gland"))
    assert e.value.code == ErrorCode.schema and "gland_volume" in e.value.hint
    with pytest.raises(ToolError) as e:
        resolve(PlausibilityCheck(check="gland_volume", deliverable="gland", params={"max_l": 3}))
    assert e.value.code == ErrorCode.schema
    r = run("gland_volum", tmp_path, {}, "gland")
    assert r.ok is False and "unknown plausibility check" in r.message


def test_contracts_declare_known_checks_over_their_own_deliverables() -> None:
    for task in list_contracts():
        c = load_contract(task)
        assert c.plausibility, f"{task} declares no plausibility check"
        for spec in c.plausibility:
            resolve(spec)  # raises on an unknown check or bad params
    with pytest.raises(ValidationError, match="unknown deliverable"):
        TaskContract(id="t", domain="any", goal="g", deliverables=[],
                     plausibility=[PlausibilityCheck(check="finite_image", deliverable="nope")])
    with pytest.raises(ValidationError):
        PlausibilityCheck(check="finite_image", deliverable="x", limit=3)  # extra=forbid


def test_every_check_documents_its_limits() -> None:
    for name, c in CHECKS.items():
        assert len(c.doc) > 60, name
        c.params()  # every limit has a default


def test_run_checks_skips_undelivered_and_names_the_failure(tmp_path, gland) -> None:
    path, _ = gland
    c = load_contract("prostate_report")
    nii(tmp_path / "gland.nii.gz", np.ones((96, 96, 24), np.int16))
    results = run_checks(c, case(tmp_path), tmp_path, {"gland": (True, ""), "findings": (False, "not written")})
    by = {(r.check, r.deliverable): r for r in results}
    assert by[("gland_volume", "gland")].ok is False
    assert by[("lesions_in_gland", "findings")].ok is None and "did not validate" in by[("lesions_in_gland",
                                                                                           "findings")].message
    msg = summary_message(results)
    assert msg.startswith("plausibility check 'gland_volume' failed on gland: gland volume = 1493 mL")
    assert "(limit 10–250 mL)" in msg and "1 more failed: organ_off_edge" in msg


def test_checks_read_the_sequences_the_engine_already_loaded(tmp_path, brain) -> None:
    """With ``loaded``, a check judges the arrays the tools received, not a second decode of the
    file: a provider that returns another image changes the verdict; None falls back to the file."""
    from bcer.contracts import Image
    from bcer.engine.plausibility.core import FileCache

    c, head = brain
    t1 = np.asarray(nib.load(c.sequences["T1"].path).dataobj)
    aff = np.diag([3.0, 3.0, 3.0, 1.0])
    den = nii(tmp_path / "den.nii.gz", t1, aff)
    spec = PlausibilityCheck(check="similar_to_input", deliverable="im", uses={}, params={})
    asked: list[str] = []

    def noise(key: str):
        asked.append(key)
        return Image(np.random.default_rng(3).random(t1.shape).astype(np.float32), aff)

    r = run_check(spec, c, tmp_path, {"im": den}, FileCache(noise))
    assert asked == ["T1"] and r.ok is False and abs(r.value) < 0.1  # judged the provided arrays
    r = run_check(spec, c, tmp_path, {"im": den}, FileCache(lambda key: None))
    assert r.ok and r.value > 0.99  # nothing loaded: the file is read
