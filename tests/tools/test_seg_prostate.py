"""seg.prostate on prostate phantoms: gland/zone Dice vs truth, ADC audit, typed errors."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.artifacts import Image
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.prostate import make_prostate
from bcer.tools.registry import call_tool, get_tool
from bcer.metrics import dice


@pytest.mark.parametrize("seed,n_lesions,oblique,misalign", [
    (0, 1, True, True), (1, 0, True, True), (4, 2, True, False), (5, 2, False, True), (11, 1, True, False)])
def test_gland_and_zone_dice(seed: int, n_lesions: int, oblique: bool, misalign: bool) -> None:
    ph = make_prostate(f"p{seed}", seed, size="small", n_lesions=n_lesions, oblique=oblique, misalign=misalign)
    t2w = ph.sequences["T2w"]
    out = call_tool("seg.prostate", {"t2w": t2w, "adc": ph.sequences["ADC"]})
    zones_truth = np.asarray(ph.labels["zones"].data)
    d_gland = dice(out["gland"].data > 0, ph.labels["gland"].data > 0)
    assert d_gland >= 0.85, f"gland Dice {d_gland:.3f}"
    assert dice(out["zones"].data == 2, zones_truth == 2) >= 0.75  # TZ
    assert dice(out["zones"].data == 1, zones_truth == 1) >= 0.75  # PZ
    np.testing.assert_array_equal(out["gland"].data > 0, out["zones"].data > 0)
    np.testing.assert_array_equal(out["zones"].affine, t2w.affine)
    meta = out["zones"].meta
    # 15 %: the default ensemble (0.3.0) reads glands of bcer's base family a few per cent small
    # (Dice 0.951 and 7.9 % under on 20 of them, against 0.962 and 3.5 % for 0.2.0 alone), the
    # price of holding on the independent family (docs/segmenters.md)
    assert meta["gland_ml"] == pytest.approx(ph.truth["gland_volume_ml"], rel=0.15)
    if not misalign:  # ADC audit (affine resampling only): PZ 1550-1800 vs TZ 1100-1300
        assert meta["pz_median_adc"] > meta["tz_median_adc"] + 150


def test_without_adc_and_spec() -> None:
    ph = make_prostate("p2", 2, size="small")
    out = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]})
    assert dice(out["gland"].data > 0, ph.labels["gland"].data > 0) >= 0.85
    assert "pz_median_adc" not in out["zones"].meta
    spec = get_tool("seg.prostate").spec
    assert [(p.name, p.required) for p in spec.inputs] == [("t2w", True), ("adc", False)]
    assert [p.name for p in spec.outputs] == ["gland", "zones"]


def test_error_paths() -> None:
    ph = make_prostate("perr", 3, size="small")
    t2w, adc = ph.sequences["T2w"], ph.sequences["ADC"]
    with pytest.raises(ToolError) as e:
        call_tool("seg.prostate", {"t2w": Image(t2w.data[..., 0], t2w.affine)})
    assert e.value.code == ErrorCode.shape and e.value.context["arg"] == "t2w"
    bad = adc.data.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ToolError) as e:
        call_tool("seg.prostate", {"t2w": t2w, "adc": Image(bad, adc.affine)})
    assert e.value.code == ErrorCode.numeric and e.value.context["arg"] == "adc"
    with pytest.raises(ToolError) as e:  # a flat image has no central gland
        call_tool("seg.prostate", {"t2w": Image(np.full(t2w.data.shape, 700.0, np.float32), t2w.affine)})
    assert e.value.code == ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        call_tool("seg.prostate", {"t2w": t2w}, {"bundle_dir": "/no/such/bundle"})
    assert e.value.code == ErrorCode.input_missing


@pytest.mark.parametrize("seed,n_lesions", [(26369, 2), (32827, 1), (4958, 1), (56979, 2)])
def test_lesion_zone_follows_the_truth_zone(seed: int, n_lesions: int) -> None:
    """Bench cases where T2-dark lesions moved the PZ/TZ border (a PZ lesion swallowed by the TZ
    band, a TZ lesion notched out of it, one filling most of the TZ): the zone holding most of
    each lesion's voxels is its true zone, and the TZ Dice stays high."""
    ph = make_prostate(f"p{seed}", seed, size="small", n_lesions=n_lesions)
    zones = np.asarray(call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]})["zones"].data)
    truth_zones, lesions = np.asarray(ph.labels["zones"].data), np.asarray(ph.labels["lesions"].data)
    assert dice(zones == 2, truth_zones == 2) >= 0.85
    for les in ph.truth["lesions"]:
        counts = np.bincount(zones[lesions == les["label"]], minlength=3)[1:]
        assert {0: "PZ", 1: "TZ"}[int(np.argmax(counts))] == les["zone"], (les["id"], counts)


@pytest.mark.parametrize("seed,n_lesions", [(0, 1), (5, 2)])
def test_classical_method_on_centred_glands(seed: int, n_lesions: int) -> None:
    """The classical fallback on the base phantoms it was built for (gland at the FOV centre)."""
    ph = make_prostate(f"c{seed}", seed, size="small", n_lesions=n_lesions)
    out = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, {"method": "classical"})
    assert out["zones"].meta["method"] == "classical_t2w"
    assert dice(out["gland"].data > 0, ph.labels["gland"].data > 0) >= 0.85
    assert dice(out["zones"].data == 2, ph.labels["zones"].data == 2) >= 0.75


def test_tz_ellipsoid_off_keeps_the_band() -> None:
    ph = make_prostate("p26369", 26369, size="small", n_lesions=2)
    out = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, {"tz_ellipsoid": False, "method": "classical"})
    assert dice(out["zones"].data == 2, ph.labels["zones"].data == 2) >= 0.75
    assert out["zones"].meta["method"] == "classical_t2w"


def test_ensemble_bundle_on_a_gland_of_the_independent_family() -> None:
    """The shipped two-member ensemble (0.2.0 and its whole-pelvis domain-randomised fine-tune): its gland
    against the truth of an independent case (seed outside every evaluation range), and its
    confidence parts are the Dice between its readings of the volume and of the mirror, computed
    here from the members' own probabilities."""
    from bcer.datasets.independent import make_gland_case
    from bcer.tools.seg import prostate_net as P
    from bcer.tools.seg.bundle import load_bundle, shipped_bundle

    ensemble = shipped_bundle("prostate_unet3d")
    ph = make_gland_case("ens", 7001, 1)
    t2 = ph.sequences["T2w"]
    gland = call_tool("seg.prostate", {"t2w": t2}, {"bundle_dir": str(ensemble)})["gland"]
    assert dice(np.asarray(gland.data) > 0, np.asarray(ph.labels["gland"].data) > 0) > 0.8
    bundle = load_bundle(ensemble)
    grid = P.canonical_grid(t2.affine, t2.shape, P.CANONICAL_SPACING)
    canon = P.zscore(P.to_canonical(t2.data, t2.affine, grid))
    one = np.mean([P.predict_probabilities(n, canon, bundle.roi_size) for n in bundle.networks], axis=0)
    other = np.mean([P.predict_probabilities(n, np.ascontiguousarray(canon[::-1]), bundle.roi_size)[:, ::-1]
                     for n in bundle.networks], axis=0)
    conf = gland.meta["confidence"]
    assert conf["parts"] == pytest.approx(P.flip_agreement(one, other), abs=1e-4)
    assert conf["threshold"] == bundle.meta["bcer"]["low_confidence_threshold"]
    assert gland.meta["ensemble_members"] == 2 and 0.0 < gland.meta["members_gland_agreement"] <= 1.0
