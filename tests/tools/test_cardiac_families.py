"""The cardiac chain (seg.cardiac -> cardiac.ed_es -> quant.cardiac_function) against truth
on randomised and held-out cines (trigger delay, either slice order, flips, large fields of
view), and cardiac.ed_es's guards: partial-volume phase curve, frames that jump."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from bcer.contracts.artifacts import Mask
from bcer.datasets.cardiac import make_cardiac
from bcer.metrics import dice
from bcer.tools.cardiac import blood_volume_curve, outlier_frames
from bcer.tools.registry import call_tool

TIE = 0.01  # a frame whose true LV volume is within 1 % of EDV of the truth's is the same phase


@lru_cache(maxsize=8)
def _chain(family: str, seed: int, group: str):
    ph = make_cardiac(f"{family[:2]}{seed}", seed, "small", group=group, family=family)
    cine = ph.sequences["CINE"]
    seg = call_tool("seg.cardiac", {"cine": cine})["labels"]
    phases = call_tool("cardiac.ed_es", {"labels": seg, "cine": cine})["phases"]
    fn = call_tool("quant.cardiac_function", {"labels": seg, "phases": phases},
                   {"height_cm": ph.metadata["height"], "weight_kg": ph.metadata["weight"]})["function"]
    return ph, seg, phases.rows[0], fn.rows[0]


@pytest.mark.parametrize("seed,group", [(11, "NOR"), (12, "DCM"), (13, "MINF")])
def test_randomised_ed_es_and_ef_against_truth(seed: int, group: str) -> None:
    """The tuning family: ED/ES exact up to a tie in the truth, EF within 3 points, LV Dice > 0.9."""
    ph, seg, row, fn = _chain("randomised", seed, group)
    t = ph.truth
    curve, edv = t["lv_volume_curve_ml"], t["lv_edv_ml"]
    for got, want in ((row["ed_frame"], t["ed_frame"]), (row["es_frame"], t["es_frame"])):
        assert got == want or abs(curve[got] - curve[want]) <= TIE * edv, (t["acquisition"], got, want)
    assert abs(fn["lv_ef_pct"] - t["lv_ef_pct"]) < 3.0
    truth = np.asarray(ph.labels["seg"].data)
    for f in (t["ed_frame"], t["es_frame"]):
        assert dice(np.asarray(seg.data)[..., f] == 3, truth[..., f] == 3) > 0.9


HELDOUT = [(0, "NOR"), (5, "HCM")]


@pytest.mark.parametrize("seed,group", HELDOUT)
def test_heldout_ed_es_within_one_frame(seed: int, group: str) -> None:
    """Held-out (never tuned on): what 20 cases measured (an earlier held-out run, in git history:
    75 % exact, every miss one frame off), not the issue's 95 % exact."""
    ph, _, row, _ = _chain("heldout", seed, group)
    t, n = ph.truth, ph.truth["n_frames"]
    for got, want in ((row["ed_frame"], t["ed_frame"]), (row["es_frame"], t["es_frame"])):
        assert min((got - want) % n, (want - got) % n) <= 1, (t["acquisition"], got, want)


@pytest.mark.parametrize("seed,group", [
    pytest.param(0, "NOR", marks=pytest.mark.xfail(strict=True, reason=(
        "known held-out shortfall: EF more than 3 points off on this cine (seg.cardiac 2.0 still); strict, "
        "so a fix shows up as XPASS"))),
    (5, "HCM"),  # 32 points off with seg.cardiac 1.2; within 3 with the 2.0 hybrid (seen as an XPASS)
])
def test_heldout_ef_goal(seed: int, group: str) -> None:
    ph, _, _, fn = _chain("heldout", seed, group)
    assert abs(fn["lv_ef_pct"] - ph.truth["lv_ef_pct"]) < 3.0


def test_partial_volume_curve_follows_the_truth() -> None:
    """On the truth labels the blood-fraction curve rises and falls with the label count and
    its extremes are the truth's frames."""
    ph = make_cardiac("pv", 21, "small", group="NOR", family="randomised")
    lab = np.asarray(ph.labels["seg"].data)
    pv = blood_volume_curve(ph.sequences["CINE"], lab)
    t = ph.truth
    assert np.corrcoef(pv, t["lv_volume_curve_ml"])[0, 1] > 0.98
    assert (int(np.argmax(pv)), int(np.argmin(pv))) == (t["ed_frame"], t["es_frame"])


def test_a_frame_that_loses_the_lv_is_never_es() -> None:
    """A segmentation failure in one frame: with the cine, the fixed-region blood curve does
    not follow the failed labels; without it, the label-count curve flags the frame."""
    ph = make_cardiac("ol", 3, "small", group="NOR")
    lab = np.asarray(ph.labels["seg"].data).copy()
    t = ph.truth
    bad = (t["es_frame"] + 3) % t["n_frames"]
    lab[..., bad][lab[..., bad] == 3] = 0  # a segmentation failure in one frame
    lab[lab.shape[0] // 2, lab.shape[1] // 2, lab.shape[2] // 2, bad] = 3
    seg = Mask(lab, ph.labels["seg"].affine, labels={1: "RV", 2: "MYO", 3: "LV"})
    row = call_tool("cardiac.ed_es", {"labels": seg, "cine": ph.sequences["CINE"]})["phases"]
    assert (row.rows[0]["ed_frame"], row.rows[0]["es_frame"]) == (t["ed_frame"], t["es_frame"])
    pv = np.array(row.rows[0]["lv_blood_curve_ml"])
    ref = blood_volume_curve(ph.sequences["CINE"], np.asarray(ph.labels["seg"].data))
    assert abs(pv[bad] - ref[bad]) < 0.05 * ref.max()  # the failed frame keeps its blood signal
    counts = call_tool("cardiac.ed_es", {"labels": seg})["phases"]
    assert (counts.rows[0]["ed_frame"], counts.rows[0]["es_frame"]) == (t["ed_frame"], t["es_frame"])
    assert counts.meta["outlier_frames"] == [bad]
    assert outlier_frames(np.array([10.0, 10.5, 11.0, 10.6, 10.1, 9.9])).sum() == 0  # a smooth cycle has none


def test_a_sharp_systole_in_few_frames_is_not_an_outlier() -> None:
    """10 frames, EF 70 %: the end-systolic frame dips some 20 mL below both neighbours, as a
    real heart does at that frame rate, and stays the ES candidate; a lost frame (the volume
    gone in one diastolic frame) is still an outlier, as is a lost frame among 25."""
    curve = np.array([91.0, 55.0, 36.0, 57.0, 92.0, 98.0, 100.0, 102.0, 111.0, 117.0])
    assert outlier_frames(curve).sum() == 0
    lost = curve.copy()
    lost[6] = 5.0
    assert np.flatnonzero(outlier_frames(lost)).tolist() == [6]
    phase = np.linspace(0, 2 * np.pi, 25, endpoint=False)
    slow = 120.0 - 40.0 * np.sin(phase / 2) ** 2  # 25 frames, stroke volume 40 mL
    slow[12] -= 45.0
    assert np.flatnonzero(outlier_frames(slow)).tolist() == [12]
