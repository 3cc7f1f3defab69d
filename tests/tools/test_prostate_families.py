"""The prostate chain on the randomised (tuning) and held-out (never tuned on) phantom families:
seg.prostate -> register.rigid (ADC -> T2w) -> detect.prostate_lesions -> classify.pirads, as the
planner wires them, against exact truth. Goals of issue 10: gland Dice >= 0.85, registration
<= 1 mm (mean over the gland), every lesion found, <= 0.5 false positives per case.

The cases are fixed in advance (the first seeds of each family), not picked from results. On
the code before the families, seg.prostate found no gland on them (Dice 0 or an error: the
classical method looks for the gland at the field-of-view centre)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import pytest

from bcer.datasets.geometry import world_coords
from bcer.datasets.prostate import make_prostate
from bcer.metrics import box_iou, dice
from bcer.tools.registry import call_tool

CASES = [("randomised", 0, 1), ("randomised", 1, 2), ("heldout", 0, 1), ("heldout", 1, 2)]


def _cases(misses: dict[tuple[str, int], str]) -> list[Any]:
    """CASES with the known misses marked as strict xfails: a miss stays visible in every run
    (with its measured value in the reason), and a fix turns it into a failure to update here.
    Held-out misses are recorded, never tuned away: the held-out family is measure-only."""
    return [pytest.param(*c, marks=pytest.mark.xfail(strict=True, reason=misses[c[:2]])) if c[:2] in misses else c
            for c in CASES]


# Known misses (none now). With seg.prostate 1.2 (prostate_unet3d 0.1.0) held-out seed 0 had gland Dice 0.756 and
# missed a 19.4 mm PZ lesion (strict xfails); both pass since 1.3 (0.2.0, fine-tuned on the widened randomised
# family only), which turned those xfails into XPASS failures and so removed them here.
DICE_MISSES: dict[tuple[str, int], str] = {}
LESION_MISSES: dict[tuple[str, int], str] = {}


def _readonly(img):
    img.data.setflags(write=False)  # as artifacts come out of Ray's object store
    return img


@lru_cache(maxsize=None)
def _chain(family: str, seed: int, n_lesions: int) -> dict[str, Any]:
    ph = make_prostate(f"{family[:2]}{seed}", seed, "small", n_lesions=n_lesions, family=family)
    t2w, adc, dwi = (_readonly(ph.sequences[k]) for k in ("T2w", "ADC", "DWI"))
    seg = call_tool("seg.prostate", {"t2w": t2w, "adc": adc})
    reg = call_tool("register.rigid", {"fixed": t2w, "moving": adc})
    found = call_tool("detect.prostate_lesions", {"adc": adc, "dwi": dwi, "gland": seg["gland"], "zones": seg["zones"],
                                                  "t2w": t2w, "transform": reg["transform"]})["findings"]
    pirads = call_tool("classify.pirads", {"findings": found})["classification"]
    return {"ph": ph, "seg": seg, "reg": reg, "found": found, "pirads": pirads}


def _error_mm(truth: np.ndarray, est: np.ndarray, gland) -> float:
    pts = world_coords(gland.affine, gland.shape)[np.asarray(gland.data) > 0]
    ph = np.c_[pts, np.ones(len(pts))]
    return float(np.linalg.norm((ph @ (est - truth).T)[:, :3], axis=1).mean())


@pytest.mark.parametrize("family,seed,n_lesions", _cases(DICE_MISSES))
def test_gland_dice_and_volume(family: str, seed: int, n_lesions: int) -> None:
    r = _chain(family, seed, n_lesions)
    ph, gland = r["ph"], r["seg"]["gland"]
    assert gland.meta["method"] == "monai_bundle"
    d = dice(np.asarray(gland.data) > 0, np.asarray(ph.labels["gland"].data) > 0)
    assert d >= 0.85, f"{family} {seed}: gland Dice {d:.3f}"
    assert gland.meta["gland_ml"] == pytest.approx(ph.truth["gland_volume_ml"], rel=0.2)
    np.testing.assert_array_equal(gland.affine, ph.sequences["T2w"].affine)


@pytest.mark.parametrize("family,seed,n_lesions", CASES)
def test_registration_adc_to_t2w(family: str, seed: int, n_lesions: int) -> None:
    r = _chain(family, seed, n_lesions)
    ph = r["ph"]
    truth = np.asarray(ph.truth["misalignment"]["matrix"])
    err = _error_mm(truth, r["reg"]["transform"].matrix, ph.labels["gland"])
    assert err <= 1.0, f"{family} {seed}: {err:.2f} mm (identity truth: {ph.truth['misalignment']['identity']})"


@pytest.mark.parametrize("family,seed,n_lesions", _cases(LESION_MISSES))
def test_every_lesion_found(family: str, seed: int, n_lesions: int) -> None:
    r = _chain(family, seed, n_lesions)
    truth, items = r["ph"].truth["lesions"], r["found"].items
    assert len(truth) == n_lesions
    for les in truth:
        best = max((box_iou(les["box_voxel"], [list(f.box_voxel[0]), list(f.box_voxel[1])]) for f in items), default=0.0)
        assert best >= 0.1, f"{family} {seed}: lesion {les['id']} ({les['zone']}, {les['size_mm']:.1f} mm) missed"
    assert r["pirads"].label.startswith("PI-RADS ")


def _false_positives(family: str, seed: int, n_lesions: int) -> list[str]:
    r = _chain(family, seed, n_lesions)
    truth = r["ph"].truth["lesions"]
    return [f.id for f in r["found"].items
            if all(box_iou(les["box_voxel"], [list(f.box_voxel[0]), list(f.box_voxel[1])]) < 0.1 for les in truth)]


def test_false_positives_per_case_within_the_goal() -> None:
    """The issue's goal, <= 0.5 false positives per case, over the four cases. Not zero on each
    case: CI (another machine, same code and phantom) once found 2 on held-out seed 0 that this
    machine does not. One is a 3-voxel ADC component at the gland's edge whose T2w footprint
    lies one voxel outside the search area here; one voxel more of gland mask puts it inside.
    A mask-edge measurement (in git history) measured how findings move when the mask moves by a
    voxel (randomised 60: 0.03 -> 0.87 false positives per case with the mask one voxel larger).
    The cohort rate is measured by the held-out bench."""
    fps = {f"{fam} {seed}": _false_positives(fam, seed, n) for fam, seed, n in CASES}
    assert sum(map(len, fps.values())) <= 0.5 * len(CASES), fps


def test_network_fallback_and_errors(monkeypatch) -> None:
    from bcer.contracts.errors import ErrorCode, ToolError
    from bcer.tools.seg import prostate_net

    ph = make_prostate("fb", 3, "small", n_lesions=0)  # base family: the classical method's own ground
    monkeypatch.setattr(prostate_net, "shipped_prostate_bundle", lambda: None)
    out = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]})
    assert out["gland"].meta["method"] == "classical_t2w" and "not installed" in out["gland"].meta["fallback"]
    assert dice(out["gland"].data > 0, ph.labels["gland"].data > 0) >= 0.85
    with pytest.raises(ToolError) as e:
        call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, {"method": "network"})
    assert e.value.code is ErrorCode.input_missing
