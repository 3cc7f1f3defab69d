"""detect.prostate_lesions on misaligned prostate phantoms: every lesion found with 3-D box
IoU >= 0.5 and the right side, <= 1 false candidate per case; both planner chains; errors."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from bcer.contracts.artifacts import Findings, Image, Mask, Transform
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.phantom import Phantom
from bcer.datasets.prostate import make_prostate
from bcer.metrics import box_iou
from bcer.tools.registry import call_tool, get_tool


@lru_cache(maxsize=32)
def _phantom(seed: int, n_lesions: int | None = None) -> Phantom:
    return make_prostate(f"p{seed}", seed, size="small", n_lesions=n_lesions, misalign=True)


def _truth_transform(ph: Phantom) -> Transform:
    return Transform(np.array(ph.truth["misalignment"]["matrix"]), "rigid")


def _detect(ph: Phantom, **extra) -> Findings:
    inputs = {"adc": ph.sequences["ADC"], "dwi": ph.sequences["DWI"], "gland": ph.labels["gland"],
              "zones": ph.labels["zones"], "t2w": ph.sequences["T2w"], "transform": _truth_transform(ph)}
    inputs.update(extra)
    return call_tool("detect.prostate_lesions", {k: v for k, v in inputs.items() if v is not None})["findings"]


def _match(found: Findings, truth: list[dict]) -> tuple[list[tuple[dict, object, float]], int]:
    """Each truth lesion with its best-overlapping finding; and the number of findings matched
    to no lesion (false candidates)."""
    pairs, used = [], set()
    for les in truth:
        best = max(found.items, key=lambda f: box_iou(f.box_voxel, les["box_voxel"]), default=None)
        iou = box_iou(best.box_voxel, les["box_voxel"]) if best is not None else 0.0
        if best is not None and iou > 0:
            used.add(best.id)
        pairs.append((les, best, iou))
    return pairs, len(found.items) - len(used)


SEEDS = list(range(12))


def test_lesions_found_with_box_iou_and_side() -> None:
    n_lesions, zone_ok, adc_err, size_err = 0, 0, [], []
    for seed in SEEDS:
        ph = _phantom(seed)
        found = _detect(ph)
        pairs, false = _match(found, ph.truth["lesions"])
        assert false <= 1, f"seed {seed}: {false} false candidates"
        for les, f, iou in pairs:
            n_lesions += 1
            assert f is not None and iou >= 0.5, f"seed {seed} lesion {les['id']}: IoU {iou:.2f}"
            assert f.side == les["side"], f"seed {seed} lesion {les['id']}: side {f.side} != {les['side']}"
            zone_ok += f.zone == les["zone"]
            adc_err.append(abs(f.attributes["adc"] - les["adc"]))
            size_err.append(abs(f.attributes["size_mm"] - les["size_mm"]))
            lo, hi = np.array(f.box_world[0]), np.array(f.box_world[1])
            assert np.all(np.abs(lo - les["box_world"][0]) < 4.0) and np.all(np.abs(hi - les["box_world"][1]) < 4.0)
        assert np.allclose(found.affine, ph.labels["gland"].affine)
    assert n_lesions >= 10
    assert zone_ok / n_lesions >= 0.9
    assert np.median(adc_err) < 20 and max(adc_err) < 50  # native-grid ADC: no partial-volume bias
    assert np.median(size_err) < 1.5


def test_no_lesion_cases_have_at_most_one_false_candidate() -> None:
    for seed in (40, 41, 42):
        found = _detect(_phantom(seed, n_lesions=0))
        assert len(found.items) <= 1


def test_chain_through_register_apply() -> None:
    """The other planner chain: ADC and DWI resampled onto the T2w grid first, no transform."""
    for seed in (1, 5):
        ph = _phantom(seed)
        tx, t2 = _truth_transform(ph), ph.sequences["T2w"]
        moved = {name: call_tool("register.apply", {"moving": ph.sequences[name], "transform": tx, "fixed": t2})["image"]
                 for name in ("ADC", "DWI")}
        found = _detect(ph, adc=moved["ADC"], dwi=moved["DWI"], transform=None)
        assert found.meta["transform"].startswith("identity")
        pairs, false = _match(found, ph.truth["lesions"])
        assert false <= 1
        for les, f, iou in pairs:
            assert iou >= 0.5 and f.side == les["side"]


def test_spec() -> None:
    spec = get_tool("detect.prostate_lesions").spec
    assert spec.milestone == "detection" and [p.name for p in spec.outputs] == ["findings"]
    ports = {p.name: p.required for p in spec.inputs}
    assert ports == {"adc": True, "dwi": True, "gland": True, "zones": False, "transform": False, "t2w": False}


def test_errors() -> None:
    ph = _phantom(1)
    adc, dwi, gland = ph.sequences["ADC"], ph.sequences["DWI"], ph.labels["gland"]
    with pytest.raises(ToolError) as e:  # DWI on the T2w grid, ADC on its own
        _detect(ph, dwi=ph.sequences["T2w"])
    assert e.value.code == ErrorCode.shape and e.value.context["arg"] == "dwi"
    with pytest.raises(ToolError) as e:  # zones on the ADC grid, gland on T2w
        _detect(ph, zones=ph.labels["gland_adc"])
    assert e.value.code == ErrorCode.shape
    bad = np.asarray(adc.data).copy()
    bad[5, 5, 5] = np.inf
    with pytest.raises(ToolError) as e:
        _detect(ph, adc=Image(bad, adc.affine))
    assert e.value.code == ErrorCode.numeric and e.value.context["arg"] == "adc"
    with pytest.raises(ToolError) as e:
        _detect(ph, gland=Mask(np.zeros(gland.shape, np.int16), gland.affine))
    assert e.value.code == ErrorCode.value_range and e.value.context["arg"] == "gland"
    with pytest.raises(ToolError) as e:
        _detect(ph, transform=Transform(np.zeros((4, 4))))
    assert e.value.code == ErrorCode.value_range and e.value.context["arg"] == "transform"
    far = np.eye(4)
    far[:3, 3] = 500.0  # the gland lands outside the ADC field of view
    with pytest.raises(ToolError) as e:
        _detect(ph, transform=Transform(far))
    assert e.value.code == ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        call_tool("detect.prostate_lesions", {"adc": adc, "dwi": dwi, "gland": gland}, {"min_volume_ml": -1})
    assert e.value.code == ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        call_tool("detect.prostate_lesions", {"adc": adc, "gland": gland})
    assert e.value.code == ErrorCode.input_missing


# Bench cases (prostate_report, seed 0) that failed before: (seed, n_lesions) of sub-pr001 (two PZ
# lesions next to the TZ), sub-pr007 (two TZ lesions a voxel apart on the ADC grid) and sub-pr009
# (a T2-dark TZ lesion filling most of the TZ).
BENCH_CASES = [(26369, 2), (56979, 2), (4958, 1)]


@pytest.mark.parametrize("seed,n_lesions", BENCH_CASES)
def test_bench_cases_through_the_plan(seed: int, n_lesions: int) -> None:
    """seg.prostate -> register.rigid -> detect -> classify.pirads, as the planner wires them:
    every lesion found (IoU >= 0.5, right side, right zone) and the case's PI-RADS right."""
    ph = _phantom(seed, n_lesions)
    seg = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"], "adc": ph.sequences["ADC"]})
    reg = call_tool("register.rigid", {"fixed": ph.sequences["T2w"], "moving": ph.sequences["ADC"]})
    found = call_tool("detect.prostate_lesions", {
        "adc": ph.sequences["ADC"], "dwi": ph.sequences["DWI"], "gland": seg["gland"], "zones": seg["zones"],
        "t2w": ph.sequences["T2w"], "transform": reg["transform"]})["findings"]
    pairs, false = _match(found, ph.truth["lesions"])
    assert false == 0 and len(pairs) == n_lesions
    for les, f, iou in pairs:
        assert iou >= 0.5 and f.side == les["side"] and f.zone == les["zone"], (les["id"], iou, f)
    label = call_tool("classify.pirads", {"findings": found})["classification"].label
    assert label == f"PI-RADS {ph.truth['max_category']}"


def test_normal_level_ignores_a_lesion_filling_the_zone() -> None:
    from bcer.tools.detect.reference import _normal_level

    rng = np.random.default_rng(0)
    tz = np.r_[rng.normal(650, 20, 700), rng.normal(1200, 20, 300)]  # 70 % lesion
    assert _normal_level(tz, 20.0) == pytest.approx(1200, abs=10)
    assert _normal_level(rng.normal(1200, 20, 1000), 20.0) == pytest.approx(1200, abs=5)  # no lesion: median


def test_noise_sd_from_neighbour_differences_ignores_structure() -> None:
    """A zone mask holding two tissue levels (a lesion, the other zone) has a wide spread of
    values, but its noise is what neighbour differences say."""
    from bcer.tools.detect.reference import _noise_sd

    rng = np.random.default_rng(1)
    a = np.where(np.arange(30)[:, None, None] < 15, 1700.0, 1100.0) + rng.normal(0, 40, (30, 30, 8))
    sd = _noise_sd(a, {"PZ": np.ones(a.shape, bool)})
    assert sd == pytest.approx(40, rel=0.1)
    assert np.std(a) > 250  # the spread a value-based estimate would have used


def _synthetic(lesion: tuple[float, float] | None, carve: bool = False, pz: float = 1700.0, tz: float = 1150.0,
               tz_semi: tuple[float, float, float] = (15.0, 10.0, 13.0), tz_y: float = 5.0):
    """A gland on a 2.5 x 2.5 x 3.6 mm grid (PZ shell around a TZ core) in fat (ADC 350, low S0),
    b = 2000 DWI, ADC noise SD 50; optionally a 9 mm lesion of ADC ``lesion[0]`` in the posterior
    PZ at the capsule, cut out of the gland mask when ``carve`` (as a segmentation does).
    ``tz_semi``/``tz_y``: the TZ's semi-axes and y centre (mm); a larger TZ thins the PZ."""
    rng = np.random.default_rng(7)
    shape, sp = (48, 48, 14), np.array([2.5, 2.5, 3.6])
    aff = np.diag([*sp, 1.0])
    aff[:3, 3] = -sp * (np.array(shape) - 1) / 2
    pts = np.stack(np.meshgrid(*[(np.arange(n) - (n - 1) / 2) * s for n, s in zip(shape, sp)], indexing="ij"), -1)
    r_gl = np.sqrt((pts[..., 0] / 24) ** 2 + (pts[..., 1] / 18) ** 2 + (pts[..., 2] / 18) ** 2)
    r_tz = np.sqrt((pts[..., 0] / tz_semi[0]) ** 2 + ((pts[..., 1] - tz_y) / tz_semi[1]) ** 2
                   + (pts[..., 2] / tz_semi[2]) ** 2)
    zones = np.where(r_gl < 1, np.where(r_tz < 1, 2, 1), 0).astype(np.int16)
    adc = np.select([zones == 2, zones == 1], [tz, pz], 350.0)
    s0 = np.select([zones == 2, zones == 1], [800.0, 1000.0], 60.0)
    les = np.zeros(shape, bool)
    if lesion is not None:
        les = (np.linalg.norm(pts - np.array([8.0, -14.0, 0.0]), axis=-1) < lesion[1] / 2) & (zones == 1)
        adc = np.where(les, lesion[0], adc)
    dwi = s0 * np.exp(-2000e-6 * adc) + rng.normal(0, 5, shape)
    adc = np.clip(adc + rng.normal(0, 50, shape), 0, None)
    gland = (zones > 0) & ~(les if carve else False)
    t2 = np.select([les, zones == 2, zones == 1], [400.0, 500.0, 900.0], 750.0) + rng.normal(0, 15, shape)
    mk = lambda x, cls: cls(np.asarray(x, np.float32 if cls is Image else np.int16), aff)  # noqa: E731
    inputs = {"adc": mk(adc, Image), "dwi": mk(np.abs(dwi), Image), "gland": mk(gland, Mask),
              "zones": mk(np.where(gland, zones, 0), Mask), "t2w": mk(t2, Image)}
    return inputs, les


@pytest.mark.parametrize("carve", [False, True])
def test_pz_lesion_read_against_its_own_zone(carve: bool) -> None:
    """A PZ lesion whose ADC (1250) is above the TZ's (1150) but 26 % below the PZ's is found
    (a reference taken from the lowest zone, as in version 1.2, cannot see it), also when the
    gland mask leaves it out at the capsule (the rim search); fat at the gland's edge (ADC 350,
    b = 2000) makes no finding."""
    inputs, les = _synthetic((1250.0, 9.0), carve=carve)
    found = call_tool("detect.prostate_lesions", inputs)["findings"]
    truth_box = [np.argwhere(les).min(0).tolist(), (np.argwhere(les).max(0) + 1).tolist()]
    assert len(found.items) == 1, [(f.zone, f.attributes["size_mm"], f.attributes["adc"]) for f in found.items]
    f = found.items[0]
    assert box_iou(f.box_voxel, truth_box) >= 0.5 and f.zone == "PZ"
    assert f.attributes["adc"] == pytest.approx(1250, abs=60)
    assert found.meta["zone_adc_median"]["PZ"] == pytest.approx(1700, abs=30)
    assert found.meta["zone_adc_median"]["TZ"] == pytest.approx(1150, abs=30)
    assert not call_tool("detect.prostate_lesions", _synthetic(None)[0])["findings"].items
    no_rim = call_tool("detect.prostate_lesions", inputs, {"rim_mm": 0.0})["findings"].items
    assert bool(no_rim) is not carve  # the carved-out lesion needs the rim


def test_split_levels_separates_touching_lesions_of_different_adc() -> None:
    from bcer.tools.detect.prostate_lesions import _split_levels

    a = np.full((20, 10, 6), 1200.0)
    a[2:9, 2:8, 1:5], a[9:17, 2:8, 1:5] = 930.0, 640.0  # two blocks in contact
    comps = (a < 1100).astype(np.int32)
    out, n = _split_levels(comps, 1, a, np.full(a.shape, 1100.0), 20.0, 4)
    assert n == 2
    assert len(np.unique(out[2:9, 2:8, 1:5])) == 1 and len(np.unique(out[9:17, 2:8, 1:5])) == 1
    assert out[5, 5, 2] != out[12, 5, 2]
    same, n1 = _split_levels(comps, 1, np.where(a < 1100, 640.0, a), np.full(a.shape, 1100.0), 20.0, 4)
    assert n1 == 1 and np.array_equal(same > 0, comps > 0)


@pytest.mark.parametrize("lesion_adc", [1250.0, 1150.0])
def test_pz_lesion_under_a_tz_label_read_against_the_pz(lesion_adc: float) -> None:
    """A segmentation that calls one voxel of a T2-dark PZ lesion TZ (randomised case ra051)
    puts the whole 9 mm lesion in the zone border band, where version 1.3 read it against the
    TZ's level only (ADC 1150) and missed it at ADC 1250 or 1150 (26 / 32 % below the PZ's
    1700). The PZ reading finds it, box IoU 1.0 against the truth, as a PZ lesion; without
    that reading it stays missed (the failure mode)."""
    inputs, les = _synthetic((lesion_adc, 9.0))
    zones = np.asarray(inputs["zones"].data).copy()
    c = tuple(np.argwhere(les).mean(axis=0).round().astype(int))
    zones[c] = 2
    inputs["zones"] = Mask(zones, inputs["zones"].affine)
    truth_box = [np.argwhere(les).min(0).tolist(), (np.argwhere(les).max(0) + 1).tolist()]
    found = call_tool("detect.prostate_lesions", inputs)["findings"]
    assert len(found.items) == 1 and found.meta["pz_read"] == 1
    f = found.items[0]
    assert f.zone == "PZ" and box_iou(f.box_voxel, truth_box) >= 0.9
    assert f.attributes["adc"] == pytest.approx(lesion_adc, abs=60)
    assert not call_tool("detect.prostate_lesions", inputs, {"pz_reading": False})["findings"].items


def test_outline_keeps_off_a_neighbouring_lesion() -> None:
    """Two lesions whose components touch (growth gives each voxel to its nearest core): the
    first one's outline (one voxel around it, below half way to the reference) must not take
    the second one's voxels (randomised case ra055: a 4 mm PZ lesion next to a 20 mm one was
    swallowed, box IoU 0.009)."""
    from bcer.tools.detect.prostate_lesions import _Maps, _outline

    a = np.full((20, 20, 8), 1500.0)
    a[3:10, 3:10, 2:6] = 800.0  # the large lesion
    a[10:12, 5:7, 3:5] = 950.0  # a small one touching it
    comps = np.zeros(a.shape, np.int32)
    comps[3:10, 3:10, 2:6], comps[10:12, 5:7, 3:5] = 1, 2
    d = np.where(a < 1500, 300.0, 100.0)
    ones = np.ones(a.shape, bool)
    mp = _Maps(core=a < 1200, loose=a < 1300, sa=a, ref=np.full(a.shape, 1500.0), thr=np.full(a.shape, 1200.0),
               dref=np.full(a.shape, 100.0), dnorm=np.full(a.shape, 100.0), gl=ones, covered=ones, info={})
    out, n = _outline(comps, 2, a, d, mp, 0.12)
    assert n == 2
    assert np.array_equal(out == 2, comps == 2)  # the small lesion keeps all its 8 voxels
    assert np.array_equal(out == 1, comps == 1)


def test_lesion_mostly_outside_the_gland_mask_keeps_its_box() -> None:
    """A PZ lesion at the capsule that the gland mask mostly leaves out (a segmentation's
    usual error on a T2-dark lesion), only its inner edge inside: reported over its whole
    outline (gland and rim), box IoU >= 0.5 against the truth; version 1.3 reported the inside
    sliver only (randomised case ra112: a one-voxel box, size 0 mm, a false positive)."""
    inputs, les = _synthetic((900.0, 9.0))
    pts_y = np.argwhere(les)[:, 1]
    keep_in = les & (np.arange(les.shape[1])[None, :, None] >= pts_y.max())  # the innermost row only
    gland = (np.asarray(inputs["gland"].data) > 0) & ~(les & ~keep_in)
    zones = np.where(gland, np.asarray(inputs["zones"].data), 0).astype(np.int16)
    inputs["gland"] = Mask(gland.astype(np.int16), inputs["gland"].affine)
    inputs["zones"] = Mask(zones, inputs["zones"].affine)
    assert 0 < np.count_nonzero(les & gland) * 3 < np.count_nonzero(les)  # under a third inside
    truth_box = [np.argwhere(les).min(0).tolist(), (np.argwhere(les).max(0) + 1).tolist()]
    found = call_tool("detect.prostate_lesions", inputs)["findings"]
    assert len(found.items) == 1
    f = found.items[0]
    assert box_iou(f.box_voxel, truth_box) >= 0.5 and f.zone == "PZ", (f.box_voxel, truth_box)
    assert f.attributes["size_mm"] >= 6.0


_THIN_PZ = {"tz_semi": (19.0, 15.0, 15.0), "tz_y": 0.0}  # posterior PZ 2 ADC voxels (5 mm) thick


def _thin_pz_findings(lesion_adc: float) -> tuple[list, list]:
    inputs, les = _synthetic((lesion_adc, 9.0), **_THIN_PZ)
    assert np.count_nonzero(np.asarray(inputs["zones"].data)[24, :, 7] == 1) == 2  # the thin PZ
    truth_box = [np.argwhere(les).min(0).tolist(), (np.argwhere(les).max(0) + 1).tolist()]
    found = call_tool("detect.prostate_lesions", inputs)["findings"].items
    return [(f.zone, box_iou(f.box_voxel, truth_box)) for f in found], truth_box


def test_thin_pz_lesion_below_the_tz_level_is_found() -> None:
    """Control for the thin-PZ failure below: in a 5 mm PZ beside normal TZ (ADC 1150), a 9 mm
    PZ lesion at ADC 900 (below the TZ's threshold, so the band reading sees it) is found as one
    PZ lesion, box IoU >= 0.9 against the truth."""
    got, _ = _thin_pz_findings(900.0)
    assert len(got) == 1 and got[0][0] == "PZ" and got[0][1] >= 0.9, got


@pytest.mark.xfail(strict=True, reason="known weakness since 1.4 (a stress measurement in git history): a "
                                       "PZ-reading outline against the PZ level takes in the normal TZ beside it and "
                                       "is dropped; a fix tried (not adopted) raised FP/case on the randomised family")
@pytest.mark.parametrize("lesion_adc", [1150.0, 1050.0])
def test_thin_pz_lesion_at_the_tz_level_is_found(lesion_adc: float) -> None:
    """The thin-PZ failure mode (randomised tz_scale pinned at 0.8: truth-mask detection 56 ->
    52/60): a 9 mm PZ lesion at ADC 1150 or 1050 (32 / 38 % below the PZ's 1700, at or just
    below the TZ's 1150) in a 5 mm PZ beside normal TZ should be found as a PZ lesion with box
    IoU >= 0.9. Versions 1.4 and 1.5 find nothing (strict xfail: passing means it was fixed)."""
    got, _ = _thin_pz_findings(lesion_adc)
    assert len(got) == 1 and got[0][0] == "PZ" and got[0][1] >= 0.9, got


# -- step 5: periprostatic tissue a mask one voxel too large takes in --------------------------

_SPACING = (2.5, 2.5, 3.6)


def _edge_case(a_val: float, d_val: float, where: tuple[slice, ...], b_value: float | None = None) -> str:
    """``not_a_lesion`` on a component at ``where`` in a box gland (x 2..17) whose normal
    tissue has ADC 1500 and DWI 100."""
    from scipy import ndimage

    from bcer.tools.detect.prostate_lesions import LesionParams
    from bcer.tools.detect.periprostatic import not_a_lesion

    shape = (20, 20, 6)
    inside = np.zeros(shape, bool)
    inside[2:18, 2:18, :] = True
    comp = np.zeros(shape, bool)
    comp[where] = True
    a, d = np.where(comp, a_val, 1500.0), np.where(comp, d_val, 100.0)
    ref, dnorm = np.full(shape, 1500.0), np.full(shape, 100.0)
    depth = ndimage.distance_transform_edt(inside, sampling=_SPACING)
    return not_a_lesion(comp, a, d, ref, dnorm, depth, _SPACING, np.diag([*_SPACING, 1.0]), LesionParams(), b_value)


_SHEET = (slice(2, 3), slice(5, 13), slice(1, 5))  # the gland's outermost column, 8 voxels (17.5 mm) long


@pytest.mark.parametrize("where,d_val,dropped", [
    (_SHEET, 140.0, True),  # the capsule: ADC 0.73x, DWI 1.4x its zone, a sheet one voxel wide along the edge
    (_SHEET, 250.0, False),  # markedly DWI-bright (2.5x): a lesion, whatever its shape
    ((slice(9, 10), slice(5, 13), slice(1, 5)), 140.0, False),  # the same sheet in the middle of the gland
    ((slice(2, 3), slice(5, 7), slice(1, 3)), 140.0, False),  # 2 x 2 voxels (4.4 mm across): too short for linear
    ((slice(2, 5), slice(5, 8), slice(1, 5)), 140.0, False),  # a 3x3-voxel blob at the edge: not linear
])
def test_capsule_sheet_along_the_edge_is_not_a_lesion(where: tuple[slice, ...], d_val: float, dropped: bool) -> None:
    why = _edge_case(1100.0, d_val, where)
    assert bool(why) == dropped, why
    if dropped:
        assert "linear" in why and "1.40x" in why


@pytest.mark.parametrize("d_val,dropped", [(120.0, True), (300.0, False)])
def test_low_adc_without_dwi_signal_is_not_a_lesion(d_val: float, dropped: bool) -> None:
    """Fat: ADC 0.2x its reference and DWI 1.2x (dropped) in the middle of the gland; the same
    ADC with DWI 3x is marked restriction (kept)."""
    why = _edge_case(300.0, d_val, (slice(8, 11), slice(8, 11), slice(2, 4)))
    assert bool(why) == dropped, why
    if dropped:
        assert "without DWI signal" in why and "0.20x" in why


@pytest.mark.parametrize("a_val,d_val,b_value,dropped", [
    (550.0, 1.6, None, True),  # b unknown: 2x asked
    (550.0, 1.6, 800.0, False),  # b 800: 0.5 x exp(0.8 x 0.95) = 1.07x asked of ADC 0.37x
    (550.0, 1.6, 2000.0, True),  # b 2000: capped at 2x
    (300.0, 1.2, 800.0, True),  # fat at b 800: 0.5 x exp(0.8 x 1.2) = 1.31x asked
])
def test_dwi_asked_of_low_adc_follows_the_b_value(a_val: float, d_val: float, b_value: float | None,
                                                  dropped: bool) -> None:
    """A lesion at ADC 550 (0.37x the zone's 1500) with DWI 1.6x its zone is what a T2-dark
    lesion gives at b 800; at b 1400-2000 marked restriction is always 2x or more."""
    why = _edge_case(a_val, 100.0 * d_val, (slice(8, 11), slice(8, 11), slice(2, 4)), b_value)
    assert bool(why) == dropped, why


def test_b_value_read_from_the_dwi_metadata() -> None:
    from bcer.tools.detect.periprostatic import b_value as _b_value

    img = lambda meta: Image(np.zeros((2, 2, 2), np.float32), np.eye(4), meta)  # noqa: E731
    assert _b_value(img({"b_value": 1400})) == 1400.0
    assert _b_value(img({"b_value": "800"})) == 800.0
    assert _b_value(img({})) is None and _b_value(img({"b_value": 0})) is None
    assert _b_value(img({"b_value": "n/a"})) is None and _b_value(img({"b_value": float("nan")})) is None


def test_normal_tissue_dwi_ignores_a_lesion_filling_the_zone() -> None:
    """A TZ two-thirds filled by a lesion (ADC 600, DWI 300; normal TZ ADC 1200, DWI 100): the
    zone's median DWI is the lesion's, its normal-tissue DWI is the normal tissue's (100 +- 2),
    so the lesion reads as 3x its zone (randomised ra072, a 22.5 mm TZ lesion, read 1.05x)."""
    from bcer.tools.detect.reference import _references

    rng = np.random.default_rng(0)
    shape = (12, 12, 6)
    tz = np.ones(shape, bool)
    lesion = np.zeros(shape, bool)
    lesion[:8] = True
    a = np.where(lesion, 600.0, 1200.0) + rng.normal(0, 20, shape)
    d = np.where(lesion, 300.0, 100.0) + rng.normal(0, 2, shape)
    ref, dref, dnorm, levels = _references(a, d, {"TZ": tz}, {"TZ": tz}, np.zeros(shape, bool), tz, _SPACING, 20.0)
    assert abs(levels["TZ"] - 1200.0) < 10.0
    assert abs(float(dref[0, 0, 0]) - 300.0) < 5.0
    assert abs(float(dnorm[0, 0, 0]) - 100.0) < 2.0


@pytest.mark.parametrize("seed", [2, 7, 9])
def test_a_mask_one_voxel_too_large_adds_no_false_positive(seed: int) -> None:
    """Randomised family, the truth gland dilated by one voxel in-plane (zones and transform
    the truth's): every lesion found and nothing else. Without step 5 (1.4's rule) the same
    inputs give 2, 3 and 4 false positives: fat and capsule inside the larger mask."""
    import dataclasses

    from scipy import ndimage

    ph = make_prostate(f"ra{seed:03d}", seed, "small", n_lesions=(1, 2, 0)[seed % 3], family="randomised",
                       borderline=seed % 3 == 1)
    g = ph.labels["gland"]
    larger = dataclasses.replace(g, data=ndimage.binary_dilation(np.asarray(g.data) > 0, np.ones((3, 3, 1), bool))
                                 .astype(np.uint8))
    inputs = {"adc": ph.sequences["ADC"], "dwi": ph.sequences["DWI"], "gland": larger, "zones": ph.labels["zones"],
              "t2w": ph.sequences["T2w"], "transform": _truth_transform(ph)}
    scores = {}
    for rules in (True, False):
        found = call_tool("detect.prostate_lesions", inputs, {"periprostatic_rules": rules})["findings"].items
        hit = [any(box_iou(f.box_voxel, les["box_voxel"]) >= 0.1 for f in found) for les in ph.truth["lesions"]]
        fp = sum(all(box_iou(f.box_voxel, les["box_voxel"]) < 0.1 for les in ph.truth["lesions"]) for f in found)
        scores[rules] = (all(hit), fp)
    assert scores[True] == (True, 0), scores
    assert scores[False][0] and scores[False][1] >= 2, scores  # the case shows what step 5 removes


# -- step 6: the T2w outline at the zone border -----------------------------------------------

def _border_outline(lesion_t2: float, use_band: bool) -> tuple[np.ndarray, np.ndarray]:
    """``_refine_on_t2`` on a lesion (rows 4-9) inside a TZ of T2 210 whose last normal row (10)
    the zone masks label PZ (PZ normal 530); returns the outline and the truth lesion."""
    from bcer.tools.detect.prostate_lesions import _refine_on_t2

    shape = (16, 12, 3)
    rng = np.random.default_rng(1)
    lesion = np.zeros(shape, bool)
    lesion[4:10, 3:9, :] = True
    t2 = np.where(lesion, lesion_t2, 210.0) + rng.normal(0, 3, shape)
    t2[12:] = 530.0 + rng.normal(0, 3, (4, 12, 3))  # the true PZ, two rows past the lesion
    zones = np.full(shape, 2, np.int16)
    zones[10:] = 1  # row 10 (normal TZ tissue) and row 11 labelled PZ
    core = np.zeros(shape, bool)
    core[5:9, 4:8, :] = True  # the diffusion outline, coarser than the lesion
    near = np.zeros(shape, bool)
    near[3:12, 2:10, :] = True  # within one ADC voxel of it
    band = np.zeros(shape, bool)
    band[8:13] = True  # within border_mm of the other zone (either side)
    normal = {1: (530.0, 3.0), 2: (210.0, 3.0)}
    return _refine_on_t2(core, near, t2, zones, normal, band if use_band else None), lesion


def test_t2_outline_does_not_take_tz_tissue_the_zones_label_pz() -> None:
    """A T2-dark TZ lesion (T2 100, TZ 210) next to normal TZ tissue labelled PZ: with the band
    the outline is the lesion exactly; against the PZ's cut (315, the 1.5 outline) it also takes
    the mislabelled TZ rows 10-11, one voxel beyond the lesion (randomised ra013/ra034: TZ lesions
    1.1-1.9 mm too long, PI-RADS 5 for 4)."""
    out, lesion = _border_outline(100.0, use_band=True)
    assert np.array_equal(out, lesion)
    out15, _ = _border_outline(100.0, use_band=False)
    assert np.array_equal(out15 & ~lesion, out15 & (np.arange(16) >= 10)[:, None, None])
    assert np.count_nonzero(out15 & ~lesion) >= 8 * 3


@pytest.mark.parametrize("lesion_t2", [240.0, 100.0])
def test_t2_outline_band_keeps_a_pz_lesion_at_the_border(lesion_t2: float) -> None:
    """A PZ lesion (rows 4-9, PZ 530) touching the TZ (rows 10-, T2 210), its last two rows in
    the band: at T2 240 the TZ is darker than the lesion and gives no cut, so the band keeps the
    PZ's; at 100 the band's cut is the TZ's (155), still above the lesion. Either way the
    outline is the lesion exactly."""
    from bcer.tools.detect.prostate_lesions import _refine_on_t2

    shape = (16, 12, 3)
    rng = np.random.default_rng(2)
    lesion = np.zeros(shape, bool)
    lesion[4:10, 3:9, :] = True
    t2 = np.where(lesion, lesion_t2, 530.0) + rng.normal(0, 3, shape)
    t2[10:] = 210.0 + rng.normal(0, 3, (6, 12, 3))
    zones = np.full(shape, 1, np.int16)
    zones[10:] = 2
    core = np.zeros(shape, bool)
    core[5:9, 4:8, :] = True
    near = np.zeros(shape, bool)
    near[3:10, 2:10, :] = True  # the diffusion outline's neighbourhood, on the PZ side
    band = np.zeros(shape, bool)
    band[8:12] = True
    out = _refine_on_t2(core, near, t2, zones, {1: (530.0, 3.0), 2: (210.0, 3.0)}, band)
    assert np.array_equal(out, lesion)


def test_tz_lesion_size_and_pirads_on_a_segmented_case() -> None:
    """Randomised ra013 (tuning family) through seg.prostate, register.rigid and detect: its two
    TZ lesions (truth 14.2 mm T2-dark, 15.7 mm not dark, ADC 774/742: PI-RADS 4 and 4) are
    measured within 1 mm of the truth. Without the band the segmented TZ border's dark rim is
    counted in: no lesion is measured closer to the truth and one grows by over 1 mm (with
    prostate_unet3d 0.3.0: 14.2 and 17.2 mm; with 0.2.0 it was 15.3 and 16.9 mm). With the
    truth's zones there is no rim and the band changes nothing, so the control needs the
    segmenter."""
    ph = make_prostate("ra013", 13, "small", n_lesions=2, family="randomised", borderline=True)
    s = ph.sequences
    seg = call_tool("seg.prostate", {"t2w": s["T2w"], "adc": s["ADC"]})
    reg = call_tool("register.rigid", {"fixed": s["T2w"], "moving": s["ADC"]})
    inputs = {"adc": s["ADC"], "dwi": s["DWI"], "gland": seg["gland"], "zones": seg["zones"], "t2w": s["T2w"],
              "transform": reg["transform"]}
    errs = {}
    for band in (True, False):
        found = call_tool("detect.prostate_lesions", inputs, {"t2_border_band": band})["findings"].items
        for les in ph.truth["lesions"]:
            f = max(found, key=lambda f: box_iou(f.box_voxel, les["box_voxel"]))
            errs.setdefault(band, []).append(f.attributes["size_mm"] - les["size_mm"])
    assert all(abs(e) <= 1.0 for e in errs[True]), errs
    assert all(abs(t) <= abs(f) for t, f in zip(errs[True], errs[False])) and max(errs[False]) >= 1.0, errs


def test_t2_parts_splits_separate_dark_parts_and_joins_specks() -> None:
    """Two T2-dark blobs two voxels apart and a one-voxel speck: two parts, the speck with the
    nearer blob; a blob with only a speck beside it, or a single blob, stays whole."""
    from bcer.tools.detect.outline import t2_parts

    out = np.zeros((20, 12, 4), bool)
    out[2:8, 3:9, 1:3], out[10:16, 3:9, 1:3] = True, True  # 72 voxels each, rows 8-9 between
    out[17, 5, 1] = True  # a speck next to the second blob (one voxel away)
    parts = t2_parts(out, voxel_ml=0.001, min_ml=0.05)
    assert [int(p.sum()) for p in parts] == [72, 73] and parts[1][17, 5, 1]
    assert np.array_equal(parts[0] | parts[1], out)
    small = out.copy()
    small[10:16] = False  # one blob and the speck
    assert len(t2_parts(small, 0.001, 0.05)) == 1 and t2_parts(small, 0.001, 0.05)[0] is small
    assert len(t2_parts(out, 0.001, 0.1)) == 1  # parts under the size limit: one outline


def test_adc_share_gives_each_adc_voxel_to_the_nearest_part() -> None:
    """ADC grid twice as coarse as the T2w grid and shifted by a transform: each ADC voxel of a
    component over both parts goes to the part under it; a part without ADC voxels: None."""
    from bcer.tools.detect.outline import adc_share

    t2_aff, adc_aff = np.diag([1.0, 1.0, 1.0, 1.0]), np.diag([2.0, 2.0, 1.0, 1.0])
    shift = np.eye(4)
    shift[0, 3] = 2.0  # T2w world x -> ADC world x + 2 mm (fixed -> moving)
    parts = [np.zeros((24, 8, 2), bool), np.zeros((24, 8, 2), bool)]
    parts[0][0:10], parts[1][12:24] = True, True
    comp = np.zeros((12, 4, 2), bool)
    comp[1:12] = True  # ADC x = 2..22 mm, T2w x = 0..20
    shares = adc_share(comp, parts, adc_aff, t2_aff, shift)
    assert shares is not None and not (shares[0] & shares[1]).any() and np.array_equal(shares[0] | shares[1], comp)
    assert np.flatnonzero(shares[0].any(axis=(1, 2))).tolist() == [1, 2, 3, 4, 5, 6]  # T2w x 0-10: part 0
    only = np.zeros_like(comp)
    only[8:12] = True  # T2w x 14-20: all in part 1
    assert adc_share(only, parts, adc_aff, t2_aff, shift) is None


def test_two_lesions_the_adc_grid_joins_are_two_findings() -> None:
    """Randomised ra085 (tuning family) with the truth's gland, zones and transform: a 13.6 mm and
    a 6.6 mm TZ lesion two T2w voxels apart are one ADC component; the T2w outline keeps them
    apart (detect 1.7): two findings within 1 mm of the truth and PI-RADS 4, where 1.6's single
    finding measured over both (over 15 mm) read PI-RADS 5."""
    from bcer.contracts.artifacts import Transform

    ph = make_prostate("ra085", 85, "small", n_lesions=2, family="randomised", borderline=True)
    s = ph.sequences
    inputs = {"adc": s["ADC"], "dwi": s["DWI"], "gland": ph.labels["gland"], "zones": ph.labels["zones"],
              "t2w": s["T2w"], "transform": Transform(np.asarray(ph.truth["misalignment"]["matrix"]), "rigid")}
    found = call_tool("detect.prostate_lesions", inputs)["findings"]
    assert found.meta["split_on_t2"] == 1 and len(found.items) == 2
    for les in ph.truth["lesions"]:
        f = max(found.items, key=lambda f: box_iou(f.box_voxel, les["box_voxel"]))
        assert box_iou(f.box_voxel, les["box_voxel"]) > 0.5 and abs(f.attributes["size_mm"] - les["size_mm"]) <= 1.0
    assert call_tool("classify.pirads", {"findings": found})["classification"].label.endswith("4")
    one = call_tool("detect.prostate_lesions", inputs, {"t2_split": False})["findings"]
    assert len(one.items) == 1 and one.items[0].attributes["size_mm"] > 15.0
    assert call_tool("classify.pirads", {"findings": one})["classification"].label.endswith("5")
