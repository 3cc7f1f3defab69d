"""Laterality in the patient's frame and multifocal ROIs (quant.roi_features, tools.laterality).

The side is decided against the midline fitted to the image, so the BraTS 2021 affine
(``diag(-1, -1, 1)``, origin ``(0, 239, 0)``: every voxel has world x <= 0, the midline sits
near x = -120), flipped and permuted voxel grids of the same anatomy give the same answer.
"""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.artifacts import Image, Mask
from bcer.contracts.geometry import vox2world
from bcer.datasets.brain import make_brain
from bcer.tools.laterality import midline_from_image
from bcer.tools.registry import call_tool

BRATS_AFFINE = np.array([[-1.0, 0, 0, 0], [0, -1.0, 0, 239.0], [0, 0, 1.0, 0], [0, 0, 0, 1]])
BRATS_SHAPE = (240, 240, 155)


def _head(shape: tuple[int, int, int], centre: np.ndarray, radii: np.ndarray, seed: int = 0) -> np.ndarray:
    """A skull-stripped 'brain': an ellipsoid of noisy tissue on a zero background."""
    ijk = np.indices(shape, dtype=np.float32).transpose(1, 2, 3, 0)
    inside = np.linalg.norm((ijk - centre) / radii, axis=-1) < 1.0
    rng = np.random.default_rng(seed)
    return np.where(inside, 100.0 + 5.0 * rng.standard_normal(shape), 0.0).astype(np.float32)


def _ball(shape: tuple[int, int, int], centre, radius: float) -> np.ndarray:
    ijk = np.indices(shape, dtype=np.float32).transpose(1, 2, 3, 0)
    return np.linalg.norm(ijk - np.asarray(centre, np.float32), axis=-1) < radius


def _features(data: np.ndarray, lab: np.ndarray, affine: np.ndarray, **params) -> dict:
    img, mask = Image(data, affine.copy()), Mask(lab.astype(np.int16), affine.copy(), labels={1: "tumour"})
    t = call_tool("quant.roi_features", {"image": img, "mask": mask}, params)["features"]
    return t.rows[0] | {"_meta": t.meta}


def _reoriented(data: np.ndarray, affine: np.ndarray, flip: int | None, perm: tuple[int, int, int]):
    """The same anatomy on another voxel grid: one axis flipped, then the axes permuted."""
    a = np.asarray(affine, np.float64).copy()
    if flip is not None:
        data = np.flip(data, axis=flip)
        f = np.eye(4)
        f[flip, flip], f[flip, 3] = -1.0, data.shape[flip] - 1
        a = a @ f
    p = np.eye(4)[:, list(perm) + [3]]
    return np.ascontiguousarray(np.transpose(data, perm)), a @ p


@pytest.fixture(scope="module")
def brats_head() -> np.ndarray:
    return _head(BRATS_SHAPE, np.array([119.5, 119.5, 77.0]), np.array([70.0, 90.0, 60.0]))


def test_brats_affine_right_tumour_is_right_although_world_x_is_negative(brats_head) -> None:
    """Midline at x = -119.5 (the head's centre); a tumour 30 mm to the patient's right has
    world x = -89.5 < 0, which the old world-sign rule called left."""
    mid = midline_from_image(brats_head, BRATS_AFFINE)
    assert mid is not None and mid.a + mid.b * 119.5 + mid.c * 77.0 == pytest.approx(-119.5, abs=1.0)
    for i, want in ((89.5, "R"), (149.5, "L")):  # voxel i -> x = -i; patient right = larger x
        row = _features(brats_head, _ball(BRATS_SHAPE, (i, 119.5, 77.0), 12.0), BRATS_AFFINE)
        assert row["centroid_x"] < 0 and row["side"] == want
        assert row["midline_offset_mm"] == pytest.approx(30.0 if want == "R" else -30.0, abs=1.0)
        assert row["n_foci"] == 1 and row["multifocal"] is False


def test_brats_tumour_across_the_midline_is_bilateral_with_shares(brats_head) -> None:
    ball = _ball(BRATS_SHAPE, (113.5, 119.5, 77.0), 15.0)  # centre 6 mm right of the midline
    row = _features(brats_head, ball, BRATS_AFFINE)
    x = vox2world(BRATS_AFFINE, np.argwhere(ball))[:, 0]
    right = 100.0 * float(np.mean(x > -119.5))  # truth: voxels right of the true midline
    assert row["side"] == "bilateral" and 55.0 < right < 85.0
    assert row["right_share_pct"] == pytest.approx(right, abs=3.0)
    assert row["right_share_pct"] + row["left_share_pct"] == pytest.approx(100.0)


def test_same_anatomy_same_side_on_flipped_and_permuted_grids() -> None:
    """A phantom brain (MNI anatomy), its world frame moved as BraTS files move it, then
    flipped and permuted: the side and the shares do not change, and they are the truth's."""
    for seed, side in ((3, "right"), (4, "left")):
        ph = make_brain(f"b{seed}", seed, size="small", grade="HGG", side=side)
        img, seg = ph.sequences["T1c"], ph.labels["seg"]
        shift = np.eye(4)
        shift[:3, 3] = (-120.0, 119.0, 0.0)  # every voxel's world x now < 0
        base = shift @ img.affine
        sides, shares = set(), []
        for flip, perm in ((None, (0, 1, 2)), (0, (0, 1, 2)), (2, (2, 0, 1)), (1, (1, 2, 0))):
            d, a = _reoriented(np.asarray(img.data), base, flip, perm)
            lab, _ = _reoriented(np.asarray(seg.data) > 0, base, flip, perm)
            row = _features(d, lab, a)
            assert row["centroid_x"] < 0
            sides.add(row["side"])
            shares.append(row["right_share_pct"])
        assert sides == {"R" if side == "right" else "L"}
        assert max(shares) - min(shares) < 1.0


def test_multifocal_every_focus_with_its_own_side() -> None:
    shape, aff = (60, 64, 40), np.diag([-3.0, -3.0, 3.0, 1.0])
    aff[:3, 3] = (0.0, 189.0, 0.0)
    head = _head(shape, np.array([29.5, 31.5, 19.5]), np.array([22.0, 26.0, 16.0]), seed=1)
    lab = _ball(shape, (20, 30, 20), 4.0) | _ball(shape, (40, 34, 18), 3.0)  # right (i < 29.5) and left
    lab |= _ball(shape, (29, 20, 25), 1.1)  # a 7-voxel speck (0.19 mL): below min_focus_ml
    row = _features(head, lab, aff)
    vols = [f["volume_ml"] for f in row["foci"]]
    n1, n2 = int(_ball(shape, (20, 30, 20), 4.0).sum()), int(_ball(shape, (40, 34, 18), 3.0).sum())
    assert row["n_foci"] == 2 and row["multifocal"] is True
    assert vols == pytest.approx([n1 * 0.027, n2 * 0.027])
    assert [f["side"] for f in row["foci"]] == ["R", "L"] and row["side"] == "bilateral"
    right = 100.0 * float(np.mean(np.argwhere(lab)[:, 0] < 29.5))  # the head's centre is the midline
    assert row["right_share_pct"] == pytest.approx(right, abs=0.5)
    fine = _features(head, lab, aff, min_focus_ml=0.1)
    assert fine["n_foci"] == 3 and fine["foci"][2]["volume_ml"] == pytest.approx(7 * 0.027)


def test_no_midline_no_side() -> None:
    """A field of view filled edge to edge by the body (a pelvis crop): no side is guessed."""
    shape, aff = (40, 40, 20), np.diag([2.0, 2.0, 3.0, 1.0])
    body = np.full(shape, 100.0, np.float32)
    row = _features(body, _ball(shape, (10, 20, 10), 4.0), aff)
    assert row["side"] == "" and row["right_share_pct"] is None and row["_meta"]["midline"] is None
    off = _features(body, _ball(shape, (10, 20, 10), 4.0), aff, side_reference="none")
    assert off["side"] == "" and off["n_foci"] == 1


def _two_compartment_case(left_too: bool):
    """A head with a right tumour (oedema 2 around necrosis 1) and, optionally, a second one on the left."""
    shape, aff = (60, 64, 40), np.diag([3.0, 3.0, 3.0, 1.0])
    aff[:3, 3] = (-300.0, 20.0, 0.0)  # world x < 0 everywhere; RAS grid: voxel i < 29.5 is the patient's left
    head = _head(shape, np.array([29.5, 31.5, 19.5]), np.array([22.0, 26.0, 16.0]), seed=2)
    lab = np.where(_ball(shape, (40, 30, 20), 5.0), 2, 0)
    lab[_ball(shape, (40, 30, 20), 2.5)] = 1
    if left_too:
        lab[_ball(shape, (19, 34, 18), 3.5)] = 2
    mask = Mask(lab.astype(np.int16), aff, labels={1: "necrotic_core", 2: "oedema"})
    return call_tool("quant.roi_features", {"image": Image(head, aff.copy()), "mask": mask})["features"]


def test_whole_tumour_multifocal_reaches_the_report() -> None:
    """Per-compartment rows cannot tell one tumour from two: meta["whole"] does, and the report
    says multifocal with each focus's side, while the R4 critic finds no issue in that draft."""
    from bcer.agents.r4 import reflect
    from bcer.tools.report import build_evidence, realise

    single, multi = _two_compartment_case(False), _two_compartment_case(True)
    assert single.meta["whole"]["side"] == "R" and single.meta["whole"]["multifocal"] is False
    w = multi.meta["whole"]
    assert w["multifocal"] and [f["side"] for f in w["foci"]] == ["R", "L"] and w["side"] == "bilateral"
    assert w["volume_ml"] == pytest.approx(sum(f["volume_ml"] for f in w["foci"]))
    one = build_evidence(features=single, domain="brain")
    assert one.side == "right" and one.profile() == "single" and not one.concepts["multifocal"].present
    ev = build_evidence(features=multi, domain="brain")
    assert ev.side == "" and ev.laterality == "bilateral" and ev.profile() == "multifocal"
    assert [e.side for e in ev.foci()] == ["right", "left"] and ev.concepts["multifocal"].present
    draft = realise(ev)
    text = " ".join(draft.findings + draft.impression)
    assert "multifocal, with 2 `[" in text and "Focus `focus_1` is right-hemispheric" in text
    assert "Focus `focus_2` is left-hemispheric" in text and "foci lie on both sides of the midline" in text
    assert draft.impression[0].startswith("Multifocal bilateral intra-axial glioma")
    assert reflect(draft, ev) == []
    assert realise(one).findings[0] == "There is a right-hemispheric intra-axial tumour."


def _two_tumours(seed: int, grade: str):
    """One phantom brain with a tumour in each hemisphere: the same seed gives the same grid and
    anatomy whichever side is asked for (noise-free base family), so the two cases combine."""
    a = make_brain("a", seed, size="small", grade=grade, side="right")
    b = make_brain("b", seed, size="small", grade=grade, side="left")
    sb = np.asarray(b.labels["seg"].data)
    seqs = {k: Image(np.where(sb > 0, b.sequences[k].data, a.sequences[k].data), a.sequences[k].affine.copy(),
                     {"sequence": k}) for k in ("T1", "T1c", "T2", "FLAIR")}
    return seqs, np.where(sb > 0, sb, np.asarray(a.labels["seg"].data))


@pytest.mark.parametrize("seed,grade", [(3, "HGG"), (4, "LGG")])
def test_seg_brain_tumor_keeps_every_focus(seed: int, grade: str) -> None:
    """Two tumours, one per hemisphere: the segmenter keeps both (WT Dice >= 0.9, where keeping
    only the largest gives ~0.65) and roi_features reports two foci, one on each side."""
    from bcer.metrics import dice

    seqs, truth = _two_tumours(seed, grade)
    ports = {"t1": seqs["T1"], "t1c": seqs["T1c"], "t2": seqs["T2"], "flair": seqs["FLAIR"]}
    out = call_tool("seg.brain_tumor", ports)
    assert dice(out["wt"].data > 0, truth > 0) >= 0.9
    only_main = call_tool("seg.brain_tumor", ports, {"satellite_fraction": 1.0})
    assert dice(only_main["wt"].data > 0, truth > 0) < 0.75
    w = call_tool("quant.roi_features", {"image": seqs["T1c"], "mask": out["labels"]})["features"].meta["whole"]
    assert w["multifocal"] and sorted(f["side"] for f in w["foci"]) == ["L", "R"]


def test_prostate_lesion_side_relative_to_the_gland_not_the_world_origin() -> None:
    """A patient 40 mm right of the table centre: every world x > 0, the lesion sides stay the
    truth's (relative to the gland, which the phantom centres on x = 0)."""
    from bcer.contracts.artifacts import Transform
    from bcer.datasets.prostate import make_prostate

    ph = make_prostate("p", 4, size="small", n_lesions=2, misalign=True)
    t = np.eye(4)
    t[0, 3] = 40.0

    def moved(a):
        return type(a)(a.data, t @ a.affine, dict(a.meta), **({"labels": dict(a.labels)} if isinstance(a, Mask) else {}))

    m = np.asarray(ph.truth["misalignment"]["matrix"])
    inputs = {"adc": moved(ph.sequences["ADC"]), "dwi": moved(ph.sequences["DWI"]), "gland": moved(ph.labels["gland"]),
              "zones": moved(ph.labels["zones"]), "t2w": moved(ph.sequences["T2w"]),
              "transform": Transform(t @ m @ np.linalg.inv(t), "rigid")}
    found = call_tool("detect.prostate_lesions", inputs)["findings"]
    assert len(found.items) == 2 and all(f.attributes["centroid_world"][0] > 0 for f in found.items)
    truth = sorted(ph.truth["lesions"], key=lambda les: les["centroid_world"][0])
    got = sorted(found.items, key=lambda f: f.attributes["centroid_world"][0])
    assert [f.side for f in got] == [les["side"] for les in truth] == ["L", "R"]


def test_real_mni152_head_on_a_brats_grid() -> None:
    """Real anatomy we did not make: nilearn's MNI152 T1 template, its voxels unchanged, on a
    BraTS-style grid (voxel i -> world x = -i: every voxel has x <= 0). Its mid-sagittal plane
    is the template's x = 0, voxel 98: the fitted midline must sit there, and balls 25 mm
    either side of it must get their side although both have negative world x."""
    from nilearn.datasets import load_mni152_template

    t1 = load_mni152_template(resolution=1)
    data = np.asarray(t1.get_fdata(), np.float32)
    mid_vox = float(np.linalg.solve(t1.affine, [0.0, 0.0, 0.0, 1.0])[0])  # x = 0 in MNI space
    aff = np.array([[-1.0, 0, 0, 0], [0, -1.0, 0, data.shape[1] - 1.0], [0, 0, 1.0, 0], [0, 0, 0, 1]])
    mid = midline_from_image(data, aff)
    assert mid is not None and mid.source == "image foreground outline"
    j, k = data.shape[1] / 2, data.shape[2] / 2
    world = vox2world(aff, np.array([[mid_vox, j, k]]))[0]
    assert mid.a + mid.b * world[1] + mid.c * world[2] == pytest.approx(-mid_vox, abs=2.0)
    for i, want in ((mid_vox - 25.0, "R"), (mid_vox + 25.0, "L")):
        row = _features(data, _ball(data.shape, (i, 126.0, 72.0), 8.0), aff)
        assert row["centroid_x"] < 0 and row["side"] == want
        assert abs(row["midline_offset_mm"]) == pytest.approx(25.0, abs=2.0)
