"""Does the ``low_confidence`` flag separate right from wrong segmentations? (bcer.tools.seg.confidence)

For each segmenter (seg.cardiac, seg.prostate, seg.brain_tumor with their default methods)
and phantom family, this runs the tool, reads its self-consistency score and flag from the
mask's ``meta["confidence"]``, and scores the answer against the phantom's truth. What counts
as *wrong* was fixed before any score was looked at:

* cardiac: any of LV, MYO, RV Dice (every frame) below 0.80, or the LV EF off by more than
  5 points;
* prostate: gland Dice below 0.85, or the gland volume off by more than 20 %;
* brain: WT Dice below 0.80, or TC Dice below 0.70.

Protocol: ``--family randomised`` (the development family) records each score with its
verdict and two candidate thresholds: the 5th percentile of the scores of the right answers
(``p05_right``: flag what is less self-consistent than 95 % of right answers; it needs no
wrong answers to be set) and the cut maximising Youden's J. The development families hold
very few wrong answers (1 of 30 cardiac, 1 of 60 brain), too few for Youden's J, so
``p05_right`` of the tool's own score (the lowest part) was written into ``THRESHOLDS`` by hand,
for all three tools. ``--family heldout`` uses the thresholds in the code as
they are and writes the flagged/unflagged x right/wrong table. The result file keeps both.
One thread; on this 2-core machine ~5 min for the default case counts.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/confidence.py --family randomised
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/confidence.py --family heldout
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import bcer.datasets  # noqa: F401  (registers the family generators)

os.environ.setdefault("OMP_NUM_THREADS", "1")

RESULTS = Path(__file__).parent / "results" / "confidence.json"
GROUPS = ["NOR", "DCM", "HCM", "MINF", "RV"]
SEED0 = {"randomised": 41000, "heldout": 42000}  # seeds no other benchmark or training used


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    from bcer.metrics import dice

    return dice(a, b)


def cardiac_case(i: int, family: str) -> dict[str, Any]:
    from bcer.datasets.cardiac import make_cardiac
    from bcer.tools.registry import call_tool

    ph = make_cardiac(f"c{i}", SEED0[family] + i, size="small", group=GROUPS[i % 5], family=family)
    mask = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]})["labels"]
    lab = np.asarray(mask.data)
    truth = np.asarray(ph.labels["seg"].data)
    d = {k: _dice(lab == v, truth == v) for k, v in (("LV", 3), ("MYO", 2), ("RV", 1))}
    lv = np.count_nonzero(lab == 3, axis=(0, 1, 2)).astype(float)
    ef = 100.0 * (lv.max() - lv.min()) / max(lv.max(), 1.0)
    ef_err = abs(ef - ph.truth["lv_ef_pct"])
    return {"dice": d, "ef_err": ef_err, "wrong": min(d.values()) < 0.80 or ef_err > 5.0}, mask.meta["confidence"]


def prostate_case(i: int, family: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    from bcer.datasets.prostate import make_prostate
    from bcer.tools.registry import call_tool

    ph = make_prostate(f"p{i}", SEED0[family] + i, size="small", family=family)
    mask = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, params or {})["gland"]
    gland = np.asarray(mask.data) > 0
    truth = np.asarray(ph.labels["gland"].data) > 0
    d = _dice(gland, truth)
    vol_err = abs(gland.sum() - truth.sum()) / max(truth.sum(), 1)
    return ({"dice": {"gland": d}, "volume_err": float(vol_err), "wrong": d < 0.85 or vol_err > 0.20},
            mask.meta["confidence"])


def brain_case(i: int, family: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    from bcer.datasets.brain import make_brain
    from bcer.tools.registry import call_tool

    ph = make_brain(f"b{i}", SEED0[family] + i, size="small", family=family)
    ins = {k.lower(): ph.sequences[k] for k in ("T1", "T1c", "T2", "FLAIR")}
    mask = call_tool("seg.brain_tumor", ins, params or {})["labels"]
    lab = np.asarray(mask.data)
    truth = np.asarray(ph.labels["seg"].data)
    d = {"WT": _dice(lab > 0, truth > 0), "TC": _dice(np.isin(lab, (1, 4)), np.isin(truth, (1, 4)))}
    return {"dice": d, "wrong": d["WT"] < 0.80 or d["TC"] < 0.70}, mask.meta["confidence"]


TOOLS: dict[str, tuple[str, Callable[[int, str], tuple[dict[str, Any], dict[str, Any]]]]] = {
    "cardiac": ("seg.cardiac", cardiac_case), "prostate": ("seg.prostate", prostate_case),
    "brain": ("seg.brain_tumor", brain_case)}


def _with_confidence(fn: Callable[..., tuple[dict[str, Any], dict[str, Any]]], i: int, family: str,
                     bundle: str | None = None) -> dict[str, Any]:
    """One case: its verdict plus the score and flag the tool itself reported."""
    rec, conf = fn(i, family, {"bundle_dir": bundle}) if bundle else fn(i, family)
    return {"case": i, **rec, "score": conf["score"], "parts": conf["parts"], "flagged": conf["low_confidence"],
            "reason": conf.get("reason", "")}


def table(cases: list[dict[str, Any]]) -> dict[str, int]:
    t = {"flagged_wrong": 0, "flagged_right": 0, "unflagged_wrong": 0, "unflagged_right": 0}
    for c in cases:
        t[f"{'flagged' if c['flagged'] else 'unflagged'}_{'wrong' if c['wrong'] else 'right'}"] += 1
    return t


def _score(c: dict[str, Any], how: str) -> float | None:
    """A candidate score from the parts: their min, mean, or the first (LV, gland, WT)."""
    parts = list(c["parts"].values())
    if not parts:
        return None
    return float(min(parts) if how == "min" else np.mean(parts) if how == "mean" else parts[0])


def p05_right(cases: list[dict[str, Any]]) -> float | None:
    """The 5th percentile of the right answers' scores (rounded to 3 decimals)."""
    right = [c["score"] for c in cases if not c["wrong"] and c["score"] is not None]
    return round(float(np.quantile(right, 0.05)), 3) if right else None


def best_threshold(cases: list[dict[str, Any]]) -> float | None:
    """The score cut that maximises Youden's J (sensitivity + specificity - 1) on these cases:
    the midpoint of the gap between two consecutive scores where cutting flags the lower ones
    (of equally good gaps, the lowest: fewest flags); None without both right and wrong cases."""
    scored = [c for c in cases if c["score"] is not None]
    wrong = [c["score"] for c in scored if c["wrong"]]
    right = [c["score"] for c in scored if not c["wrong"]]
    if not wrong or not right:
        return None
    levels = sorted(set(wrong + right))
    best: tuple[float, float] | None = None
    for lo, hi in zip(levels, levels[1:]):  # flag every score <= lo
        j = np.mean([w <= lo for w in wrong]) + np.mean([r > lo for r in right]) - 1.0
        if best is None or j > best[0] + 1e-12:
            best = (j, round((lo + hi) / 2, 4))
    return None if best is None else float(best[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=["randomised", "heldout"], required=True)
    ap.add_argument("--cases", type=int, nargs=3, default=[30, 80, 60], metavar=("CARDIAC", "PROSTATE", "BRAIN"))
    ap.add_argument("--domains", nargs="+", choices=list(TOOLS), default=list(TOOLS))
    ap.add_argument("--bundle", default=None, help="brain or prostate: score the tool with this bundle (its "
                    "mirror agreement); filed under 'bundles' by the bundle's name, the defaults' entries kept")
    args = ap.parse_args()
    if args.bundle and args.domains not in (["brain"], ["prostate"]):
        ap.error("--bundle needs --domains brain or --domains prostate")
    import torch

    torch.set_num_threads(1)
    from bcer.tools.seg.confidence import METHODS, THRESHOLDS

    t0 = time.time()
    out: dict[str, Any] = {}
    for (domain, (tool, fn)), n in zip(TOOLS.items(), args.cases):
        if domain not in args.domains:
            continue
        cases = [_with_confidence(fn, i, args.family, args.bundle) for i in range(n)]
        if args.bundle:
            from bcer.tools.seg.confidence import MIRROR_METHOD

            meta = json.loads((Path(args.bundle) / "configs" / "metadata.json").read_text())
            res = {"tool": tool, "bundle": f"{meta.get('name')} {meta.get('version')}",
                   "method": MIRROR_METHOD if domain == "brain" else METHODS[tool],
                   "threshold_in_bundle": meta.get("bcer", {}).get("low_confidence_threshold"), "n": n,
                   "table": table(cases), "cases": cases}
        else:
            res = {"tool": tool, "method": METHODS[tool], "threshold_in_code": THRESHOLDS[tool], "n": n,
                   "table": table(cases), "cases": cases}
        if args.family == "randomised":  # candidate thresholds, for choosing the rule on this family only
            res["p05_right_threshold"] = p05_right(cases)
            res["youden_threshold"] = {how: best_threshold([dict(c, score=_score(c, how)) for c in cases])
                                       for how in ("min", "mean", "first")}
        out[domain] = res
        print(domain, res["table"], "youden", res.get("youden_threshold"), f"{time.time() - t0:.0f} s", flush=True)
        data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        if args.bundle:  # beside the defaults' entries, which it does not replace
            entry = data.setdefault(args.family, {}).setdefault("bundles", {})
            entry[Path(args.bundle).name] = {"seeds_from": SEED0[args.family], **out,
                                                    "wall_s": round(time.time() - t0, 1)}
        else:
            data.setdefault(args.family, {}).update({"seeds_from": SEED0[args.family], **out})
            data[args.family].setdefault("wall_s", {})[domain] = round(time.time() - t0, 1)
        data["note"] = ("bcer's own synthetic phantom families only. Thresholds chosen on 'randomised' (Youden's "
                        "J), then frozen in bcer/tools/seg/confidence.py before 'heldout' was run.")
        RESULTS.write_text(json.dumps(data, indent=1, default=lambda o: o.item()) + "\n")  # numpy scalars


if __name__ == "__main__":
    main()
