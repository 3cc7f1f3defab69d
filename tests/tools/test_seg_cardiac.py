"""seg.cardiac on ACDC-like cine phantoms: Dice at ED and ES per group, geometry, typed errors."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.artifacts import Cine, Image
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.cardiac import make_cardiac
from bcer.tools.registry import call_tool, get_tool
from bcer.metrics import dice

# LV, MYO, RV (issue 4). RV 0.78, not 0.80: the network's RV at ES of the HCM seed-2 cine is
# 0.797 on the canonical in-plane orientation (seg.cardiac 2.2) and 0.805 on the stored one
# (2.1): a 2-D network moves by ~0.01 with the voxel order alone, which 2.2 fixes to one value.
TARGET = {3: 0.90, 2: 0.75, 1: 0.78}


@pytest.mark.parametrize("seed,group", [(0, "NOR"), (6, "DCM"), (2, "HCM"), (3, "MINF"), (4, "RV"),
                                        (21, "NOR"),
                                        # a dilated LV at EF ~16 %: its border moves by about a voxel and
                                        # breaks into pieces far smaller than the RV's moving border
                                        (1001, "DCM")])
def test_dice_at_ed_and_es(seed: int, group: str) -> None:
    ph = make_cardiac(f"c{seed}", seed, size="small", group=group)
    cine = ph.sequences["CINE"]
    out = call_tool("seg.cardiac", {"cine": cine})["labels"]
    truth = np.asarray(ph.labels["seg"].data)
    assert out.data.shape == cine.data.shape
    np.testing.assert_array_equal(out.affine, cine.affine)
    assert out.labels == {1: "RV", 2: "MYO", 3: "LV"}
    for frame in (ph.truth["ed_frame"], ph.truth["es_frame"]):
        for k, target in TARGET.items():
            d = dice(out.data[..., frame] == k, truth[..., frame] == k)
            assert d >= target, f"{group} frame {frame} label {k}: Dice {d:.3f} < {target}"
    # The LV volume curve in meta peaks at ED and bottoms at ES like the truth's.
    curve = out.meta["lv_volume_curve_ml"]
    assert int(np.argmax(curve)) == ph.truth["ed_frame"] and int(np.argmin(curve)) == ph.truth["es_frame"]


def test_spec() -> None:
    spec = get_tool("seg.cardiac").spec
    assert [p.name for p in spec.inputs] == ["cine"] and [p.name for p in spec.outputs] == ["labels"]
    assert spec.gpu == "optional" and spec.milestone == "segmentation"


def test_error_paths() -> None:
    ph = make_cardiac("err", 1, size="small", group="NOR")
    cine = ph.sequences["CINE"]
    with pytest.raises(ToolError) as e:  # a 3-D volume given as a cine
        call_tool("seg.cardiac", {"cine": Cine(cine.data[..., 0], cine.affine)})
    assert e.value.code == ErrorCode.shape and e.value.context["arg"] == "cine"
    with pytest.raises(ToolError) as e:  # an Image where a Cine is expected
        call_tool("seg.cardiac", {"cine": Image(cine.data[..., 0], cine.affine)})
    assert e.value.code == ErrorCode.schema
    bad = cine.data.copy()
    bad[1, 2, 3, 4] = np.inf
    with pytest.raises(ToolError) as e:
        call_tool("seg.cardiac", {"cine": Cine(bad, cine.affine)})
    assert e.value.code == ErrorCode.numeric
    still = np.repeat(cine.data[..., :1], cine.n_frames, axis=3)  # no motion: no heart to find
    with pytest.raises(ToolError) as e:
        call_tool("seg.cardiac", {"cine": Cine(still, cine.affine)})
    assert e.value.code == ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        call_tool("seg.cardiac", {"cine": cine}, {"roi_size": 4})
    assert e.value.code == ErrorCode.value_range


def _chain(cine: Cine, labels=None) -> dict:
    """seg.cardiac (unless ``labels``) -> cardiac.ed_es -> quant.cardiac_function: the function row."""
    labels = labels if labels is not None else call_tool("seg.cardiac", {"cine": cine})["labels"]
    phases = call_tool("cardiac.ed_es", {"labels": labels, "cine": cine})["phases"]
    return call_tool("quant.cardiac_function", {"labels": labels, "phases": phases})["function"].rows[0]


def _padded(cine: Cine, pads: list[tuple[int, int]]) -> Cine:
    """The same world content with a wider, zero-padded field of view (the other half of the
    ablation's space_mismatch fault)."""
    aff = np.asarray(cine.affine, np.float64).copy()
    aff[:3, 3] -= aff[:3, :3] @ np.array([p[0] for p in pads], np.float64)
    return Cine(np.pad(np.asarray(cine.data), pads + [(0, 0)]), aff, dict(cine.meta))


# (value key, tolerance between grids, tolerance vs the truth labels' value): the grids must agree
# to rounding (measured: identical to the last digit, seg.cardiac 2.3); vs truth, volumes 5 %,
# EF 3 points, median segment thickening 9 points (the ray-cast thickening of a 2-3 voxel wall
# on the truth labels is 30.7 % for this NOR phantom; on the segmentation 26.6 % with the
# cardiac_unet2d 0.2.0 walls, 22.1 % with 0.3.0. On 16 other phantoms, seeds 300-307 of the
# base and randomised families, 0.3.0's mean thickening error is 3.3 / 2.6 points against
# 0.2.0's 2.8 / 3.1: this cine is 0.3.0's worst case, not its typical one).
DELIVERABLES = [("lv_edv_ml", 1e-6, 0.05), ("lv_esv_ml", 1e-6, 0.05), ("rv_edv_ml", 1e-6, 0.05),
                ("myo_mass_g", 1e-6, 0.05), ("lv_ef_pct", 1e-6, 3.0), ("rv_ef_pct", 1e-6, 6.0),
                ("median_segment_thickening_pct", 1e-6, 9.0), ("max_wall_thickness_mm", 1e-6, 1.5)]


def test_deliverables_do_not_depend_on_the_grid() -> None:
    """The same cine transposed and flipped (in-plane and the slice order) or on a zero-padded
    field of view gives the same labels (mapped back) and the same deliverables, and both are
    near the phantom's truth. seg.cardiac 2.2 gave patient001 of the cardiac ablation another
    myocardium on a padded grid (median segment thickening 27 % vs 20 %)."""
    from tests.tools.test_cardiac import _regrid

    ph = make_cardiac("grid", 0, size="small", group="NOR")
    cine = ph.sequences["CINE"]
    ref_lab = call_tool("seg.cardiac", {"cine": cine})["labels"]
    ref = _chain(cine, ref_lab)
    truth = _chain(cine, ph.labels["seg"])
    axes, flips = [1, 0, 2], [0, 2]
    moved, maff = _regrid(np.asarray(cine.data), cine.affine, axes, flips)
    pads = [(4, 4), (2, 6), (3, 6)]
    for name, other in (("transposed+flipped", Cine(moved, maff, dict(cine.meta))), ("padded", _padded(cine, pads))):
        lab = call_tool("seg.cardiac", {"cine": other})["labels"]
        back = np.asarray(lab.data)
        if name == "padded":
            assert not back[:4].any() and not back[:, :, :3].any()  # nothing labelled in the padding
            back = back[4:-4, 2:-6, 3:-6]
        else:
            for a in flips:
                back = np.flip(back, axis=a)
            back = np.transpose(back, list(np.argsort(axes)) + [3])
        differ = int((back != np.asarray(ref_lab.data)).sum())  # 2.2 on patient001 padded: 2,098
        assert differ == 0, f"{name}: {differ} voxels labelled differently"
        got = _chain(other, lab)
        for key, tol_grid, tol_truth in DELIVERABLES:
            assert abs(got[key] - ref[key]) <= tol_grid * max(1.0, abs(ref[key])), (name, key, got[key], ref[key])
    for key, _, tol_truth in DELIVERABLES:
        err = abs(ref[key] - truth[key])
        limit = tol_truth * truth[key] if key.endswith(("_ml", "_g")) else tol_truth
        assert err <= limit, (key, ref[key], truth[key])


@pytest.mark.parametrize("axes,flips", [([0, 1, 2], [0]), ([1, 0, 2], [1, 2])])
def test_classical_labels_do_not_depend_on_the_voxel_order(axes: list[int], flips: list[int]) -> None:
    """The classical method alone (the fallback when the network cannot run) gets the same labels
    on a flipped or transposed grid: seg.cardiac runs every method on the canonical orientation.
    Before 2.4 only the network did (a flipped ablation cine got another classical RV)."""
    from tests.tools.test_cardiac import _regrid

    ph = make_cardiac("cgrid", 2, size="small", group="HCM")  # 2.3: 43 voxels differ on a flip of axis 0
    cine = ph.sequences["CINE"]
    ref = np.asarray(call_tool("seg.cardiac", {"cine": cine}, {"method": "classical"})["labels"].data)
    moved, maff = _regrid(np.asarray(cine.data), cine.affine, axes, flips)
    back = np.asarray(call_tool("seg.cardiac", {"cine": Cine(moved, maff, dict(cine.meta))},
                                {"method": "classical"})["labels"].data)
    for a in flips:
        back = np.flip(back, axis=a)
    back = np.transpose(back, list(np.argsort(axes)) + [3])
    assert int((back != ref).sum()) == 0


def test_restore_lost_frames_takes_the_network_frame() -> None:
    from bcer.tools.seg.cardiac import restore_lost_frames

    net = np.zeros((8, 8, 2, 4), np.int16)
    net[2:6, 2:6] = 3
    merged = net.copy()
    merged[..., 1] = 0  # the merge lost the LV on frame 1
    merged[2:4, 2:6, :, 2] = 0  # and half of it on frame 2 (50 % < 60 %)
    merged[2, 2, :, 3] = 0  # frame 3 lost one voxel a slice: kept
    assert restore_lost_frames(merged, net) == [1, 2]
    np.testing.assert_array_equal(merged[..., :3], net[..., :3])
    assert np.count_nonzero(merged[..., 3] == 3) == np.count_nonzero(net[..., 3] == 3) - 2


def test_no_frame_loses_its_lv() -> None:
    """Randomised seed 6033: the classical method took a third of the cavity on frames 6, 13
    and 14, the atrium veto then removed it on every slice (LV Dice 0 on those frames, 2.5)."""
    from bcer.datasets.cardiac import family_ranges

    with family_ranges("randomised"):
        ph = make_cardiac("lf", 6033, "small", group="MINF", family="randomised", borderline=False)
    out = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]})["labels"]
    truth = np.asarray(ph.labels["seg"].data)
    # the three frames are restored; a fourth borderline one on another machine's arithmetic would not
    # make the deliverable wrong, the worst-frame Dice below would
    assert {6, 13, 14} <= set(out.meta["network_frames"]), out.meta["network_frames"]
    worst = min(dice(out.data[..., t] == 3, truth[..., t] == 3) for t in range(truth.shape[3]))
    assert worst >= 0.9, worst


def test_a_bundle_states_its_own_flag_threshold(tmp_path) -> None:
    """A flag threshold belongs to the model it was chosen for: a cardiac bundle that states
    ``bcer.low_confidence_threshold`` is judged by it (same score, other verdicts at 0.0 and
    0.999); one that states none gets the tool's threshold."""
    import json
    import shutil

    from bcer.tools.seg.bundle import shipped_bundle
    from bcer.tools.seg.confidence import THRESHOLDS

    ph = make_cardiac("thr", 5, "small", group="NOR")
    verdicts = {}
    for name, own in (("none", None), ("low", 0.0), ("high", 0.999)):
        b = tmp_path / name
        shutil.copytree(shipped_bundle(), b)
        meta_file = b / "configs" / "metadata.json"
        meta = json.loads(meta_file.read_text())
        meta["bcer"].pop("low_confidence_threshold", None)
        if own is not None:
            meta["bcer"]["low_confidence_threshold"] = own
        meta_file.write_text(json.dumps(meta))
        conf = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]},
                         {"method": "hybrid", "bundle_dir": str(b)})["labels"].meta["confidence"]
        verdicts[name] = conf
    assert verdicts["none"]["threshold"] == THRESHOLDS["seg.cardiac"]
    assert verdicts["low"]["threshold"] == 0.0 and verdicts["high"]["threshold"] == 0.999
    assert verdicts["low"]["score"] == verdicts["high"]["score"] == verdicts["none"]["score"] < 0.999
    assert not verdicts["low"]["low_confidence"] and verdicts["high"]["low_confidence"]


def test_myocardium_problem_needs_the_classical_wall_to_hold() -> None:
    """The network's myocardium gives way only when it loses over a quarter of its volume over
    the cycle while the classical one does not; when both do, the network's stands."""
    from bcer.tools.seg.cardiac_checks import myo_volume_ratio, myocardium_problem

    def cine(volumes: list[int]) -> np.ndarray:
        lab = np.zeros((10, 10, 1, len(volumes)), np.int16)
        for t, v in enumerate(volumes):
            lab.reshape(-1, len(volumes))[:v, t] = 2
        return lab

    thin, held, poor = cine([40, 28, 40]), cine([40, 38, 40]), cine([40, 29, 40])
    assert myo_volume_ratio(thin) == pytest.approx(0.70) and myo_volume_ratio(held) == pytest.approx(0.95)
    assert np.isnan(myo_volume_ratio(np.zeros((4, 4, 1, 2), np.int16)))
    assert "incompressible" in myocardium_problem(thin, held, 0.75)
    assert myocardium_problem(thin, poor, 0.75) is None  # 72.5 %: the classical wall is no better founded
    assert myocardium_problem(held, thin, 0.75) is None
    assert myocardium_problem(thin, held, 0.0) is None  # the check switched off


def _myo_dice_at_ed_es(ph, params: dict) -> tuple[float, dict]:
    """Myocardium Dice of ``seg.cardiac`` at the true ED and ES frames of a phantom, and the
    labels' meta."""
    truth, frames = np.asarray(ph.labels["seg"].data), [ph.truth["ed_frame"], ph.truth["es_frame"]]
    out = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]}, params)["labels"]
    return dice(out.data[..., frames] == 2, truth[..., frames] == 2), out.meta


@pytest.mark.parametrize("seed,why,floor,check", [
    (910007, "incompressible", 0.80, "min_myo_volume_ratio"),
    (910017, "runs through the muscle", 0.85, "min_epicardial_edge_ratio"),
])
def test_a_thick_wall_drawn_thin_falls_back_to_the_classical_labels(seed: int, why: str, floor: float,
                                                                     check: str) -> None:
    """Independent-family hypertrophic hearts (walls 16-22 mm; development seeds): the shipped
    network draws the wall thin. On 910007 that wall loses ~45 % of its volume at end-systole
    (myocardium Dice ~0.5), caught by the myocardium check; on 910017 it keeps its volume but
    its outer border lies on 11 % of the classical border's image edge (Dice ~0.59), caught by
    the wall-edge check. ``auto`` takes the classical labels and the myocardium is right; with
    that check off it is not."""
    from bcer.datasets.independent.heart import make_heart_case

    ph = make_heart_case("hcm", seed, "HCM")
    got, meta = _myo_dice_at_ed_es(ph, {})
    assert why in meta["fallback"]["reason"], meta.get("fallback")
    assert got >= floor, got
    off, meta_off = _myo_dice_at_ed_es(ph, {check: 0.0})
    assert "fallback" not in meta_off and off < 0.65, off


def test_a_thick_wall_drawn_on_its_surface_keeps_the_network() -> None:
    """Original-family hypertrophic heart (development seed 940007), the lowest wall-edge ratio
    of the 60 generator-family development cines (0.55): the network's wall is right and stays."""
    got, meta = _myo_dice_at_ed_es(make_cardiac("hcm", 940007, "small", group="HCM"), {})
    assert "fallback" not in meta and "check" not in meta
    assert got >= 0.88, got


def test_delivered_labels_whose_myocardium_is_not_conserved_are_flagged() -> None:
    """Original-family RV heart (development seed 940024): the network's myocardium keeps 71 %
    of its volume and the classical one 72 %, so the hybrid stands (74 %), with a flag a person
    sees on the report; the hypertrophic heart whose classical labels stood in is not flagged,
    and the check switched off raises nothing."""
    from bcer.datasets.independent.heart import make_heart_case
    from bcer.tools.seg.cardiac_checks import myo_volume_ratio

    ph = make_cardiac("rv", 940024, "small", group="RV")
    out = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]})["labels"]
    flag = out.meta["flags"]["myocardium_not_conserved"]
    assert flag["flagged"] and flag["value"] < 0.75
    assert flag["value"] == pytest.approx(myo_volume_ratio(out.data), abs=1e-3)
    assert "fallback" not in out.meta
    off = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]}, {"min_myo_volume_ratio": 0.0})["labels"]
    assert "myocardium_not_conserved" not in off.meta["flags"]
    hcm = make_heart_case("hcm", 910007, "HCM")
    kept = call_tool("seg.cardiac", {"cine": hcm.sequences["CINE"]})["labels"]
    assert "fallback" in kept.meta and "myocardium_not_conserved" not in kept.meta["flags"]
