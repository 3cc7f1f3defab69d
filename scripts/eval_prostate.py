"""Prostate tools on phantoms of one family, in one process (no Ray): the tuning loop.

Runs the chain the planner builds for ``prostate_report`` (``seg.prostate`` ->
``register.rigid`` (ADC -> T2w) -> ``detect.prostate_lesions`` -> ``classify.pirads``) on
``--cases`` phantoms and prints per case and overall: gland Dice, registration error (mean
over the gland, mm), lesion sensitivity, false positives, box IoU and PI-RADS.

Tune ONLY on ``--family randomised``. ``heldout`` is for the final measurement
(``benchmarks/heldout.py``); do not look at its numbers while changing a tool.

Usage::

    OMP_NUM_THREADS=1 python scripts/eval_prostate.py --family randomised --cases 12 [--seed0 0] [--json OUT]

``--params JSON`` passes detect.prostate_lesions parameters (e.g. ``'{"t2_border_band": false}'`` for
1.5's T2w outline), so a detector change is compared on the same cached glands and transforms.
``--bundle-dir DIR`` runs the chain as if DIR were the shipped ``prostate_unet3d`` (``method=auto``
with its classical fallback, exactly as ``seg.prostate`` runs the shipped bundle): candidate
weights are compared with the shipped ones on the same cases before they replace them.
Case ``k`` (seed ``k``) is the same phantom whatever ``--seed0``: a long run can be split in parts.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from bcer.datasets.geometry import world_coords
from bcer.datasets.prostate import family_ranges, make_prostate
from bcer.metrics import box_iou, dice, wilson_interval
from bcer.tools.registry import call_tool


def registration_error_mm(truth: np.ndarray, est: np.ndarray, gland) -> float:
    pts = world_coords(gland.affine, gland.shape)[np.asarray(gland.data) > 0]
    ph = np.c_[pts, np.ones(len(pts))]
    return float(np.linalg.norm((ph @ (est - truth).T)[:, :3], axis=1).mean())


def lesion_scores(found: list, truth: list[dict]) -> dict[str, Any]:
    """Sensitivity (a true lesion is found when a finding's box overlaps its box with IoU >= 0.1,
    the bench's rule), false positives (findings overlapping no true lesion), best IoU per lesion."""
    hits, ious = 0, []
    for les in truth:
        best = max((box_iou(les["box_voxel"], list(map(list, f.box_voxel))) for f in found), default=0.0)
        ious.append(best)
        hits += best >= 0.1
    fp = sum(all(box_iou(les["box_voxel"], list(map(list, f.box_voxel))) < 0.1 for les in truth) for f in found)
    return {"n_true": len(truth), "hits": hits, "fp": fp, "ious": ious}


def _seg_reg(ph, cache: str | None) -> tuple[dict[str, Any], dict[str, Any], float, float]:
    """seg.prostate and register.rigid on one case, read from ``cache`` (a folder) when a run
    before stored them there: both are deterministic, so a detector change is measured on the
    same glands and transforms without rerunning them."""
    import pickle
    from pathlib import Path

    path = Path(cache) / f"{ph.case_id}.pkl" if cache else None
    if path is not None and path.exists():
        with open(path, "rb") as f:
            return pickle.load(f)
    t0 = time.time()
    seg = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"], "adc": ph.sequences["ADC"]})
    t1 = time.time()
    reg = call_tool("register.rigid", {"fixed": ph.sequences["T2w"], "moving": ph.sequences["ADC"]})
    out = ({"gland": seg["gland"], "zones": seg["zones"]}, {"transform": reg["transform"]}, t1 - t0, time.time() - t1)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(out, f)
    return out


def _describe(row: dict[str, Any], found, ph) -> None:
    """Scores and what was there and what was found, for a table of misses."""
    row.update(lesion_scores(found.items, ph.truth["lesions"]))
    row["truth"] = [(les["zone"], round(les["size_mm"], 1), round(les["adc"]), les.get("borderline"))
                    for les in ph.truth["lesions"]]
    row["found"] = [(f.zone, round(f.attributes["size_mm"], 1), round(f.attributes["adc"])) for f in found.items]


def run_case(ph, stages: str = "all", cache: str | None = None, params: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    t2w, adc, dwi = ph.sequences["T2w"], ph.sequences["ADC"], ph.sequences["DWI"]
    row: dict[str, Any] = {"case": ph.case_id, "gland_ml": round(ph.truth["gland_volume_ml"], 1)}
    if stages == "detect":  # detection alone: truth gland, zones and transform
        from bcer.contracts.artifacts import Transform

        tx = Transform(np.asarray(ph.truth["misalignment"]["matrix"]), "rigid")
        found = call_tool("detect.prostate_lesions", {"adc": adc, "dwi": dwi, "gland": ph.labels["gland"],
                                                      "zones": ph.labels["zones"], "t2w": t2w, "transform": tx},
                          params or {})["findings"]
        _describe(row, found, ph)
        row["thr"] = round(found.meta["adc_threshold"]), round(found.meta["adc_noise_sd"])
        return row
    if stages == "all":
        seg, reg, seg_s, reg_s = _seg_reg(ph, cache)
        row["seg_s"], row["reg_s"] = round(seg_s, 2), round(reg_s, 2)
    if stages == "seg":
        t0 = time.time()
        seg = call_tool("seg.prostate", {"t2w": t2w, "adc": adc})
        row["seg_s"] = round(time.time() - t0, 2)
    if stages != "reg":
        row["dice"] = round(dice(seg["gland"].data > 0, ph.labels["gland"].data > 0), 3)
        row["seg_ml"] = round(seg["gland"].meta.get("gland_ml", float("nan")), 1)
        row["seg_method"] = seg["gland"].meta.get("method")
    if stages == "seg":
        return row
    if stages == "reg":
        t0 = time.time()
        reg = call_tool("register.rigid", {"fixed": t2w, "moving": adc})
        row["reg_s"] = round(time.time() - t0, 2)
    truth_m = np.asarray(ph.truth["misalignment"]["matrix"])
    row["reg_mm"] = round(registration_error_mm(truth_m, reg["transform"].matrix, ph.labels["gland"]), 3)
    row["identity"] = bool(ph.truth["misalignment"].get("identity", False))
    if stages == "reg":
        return row
    found = call_tool("detect.prostate_lesions", {"adc": adc, "dwi": dwi, "gland": seg["gland"], "zones": seg["zones"],
                                                  "t2w": t2w, "transform": reg["transform"]}, params or {})["findings"]
    _describe(row, found, ph)
    label = call_tool("classify.pirads", {"findings": found})["classification"].label
    got = int(label.split()[-1])
    want = int(ph.truth["max_category"])
    row["pirads"] = f"{got}/{want}"
    row["pirads_ok"] = got == want or (want <= 2 and got <= 2)
    return row


def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for k in range(args.seed0, args.seed0 + args.cases):  # the case, its seed and lesion pattern: one index
        ph = make_prostate(f"{args.family[:2]}{k:03d}", k, args.size, n_lesions=(1, 2, 0)[k % 3],
                           family=args.family, borderline=args.borderline and k % 3 == 1)
        row = run_case(ph, args.stages, args.cache, args.params)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "ious"} | ({"ious": [round(x, 2) for x in row["ious"]]}
                                                                        if "ious" in row else {})), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="randomised", choices=("base", "randomised", "heldout"))
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--size", default="small")
    ap.add_argument("--stages", default="all", choices=("seg", "reg", "detect", "all"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--borderline", action="store_true", help="every third case has a borderline lesion (as the bench)")
    ap.add_argument("--cache", default=None, help="folder of seg/register outputs per case (--stages all): read "
                                                  "when there, else computed and stored")
    ap.add_argument("--pin", action="append", default=[], metavar="FIELD=LO[,HI]",
                    help="replace one range of the family for the run (prostate.family_ranges), e.g. tz_scale=0.8")
    ap.add_argument("--params", type=json.loads, default=None,
                    help='detect.prostate_lesions params as JSON, e.g. \'{"t2_border_band": false}\' (1.5\'s outline)')
    ap.add_argument("--bundle-dir", default=None, help="use this prostate_unet3d folder in place of the shipped one")
    args = ap.parse_args()
    if args.bundle_dir:
        from pathlib import Path

        from bcer.tools.seg import prostate_net

        candidate = Path(args.bundle_dir).resolve()
        prostate_net.shipped_prostate_bundle = lambda: candidate  # seg.prostate looks it up per call
    pins = {f: tuple(float(x) for x in v.split(",")) * (1 if "," in v else 2)
            for f, v in (p.split("=", 1) for p in args.pin)}
    with family_ranges(args.family, **pins):
        rows = _run(args)
    summary: dict[str, Any] = {"family": args.family, "cases": len(rows), "size": args.size, "seed0": args.seed0,
                               "bundle_dir": args.bundle_dir or "shipped", "pinned": pins, "params": args.params or {}}
    if args.stages in ("seg", "all"):
        summary.update(dice_mean=float(np.mean([r["dice"] for r in rows])),
                       dice_min=float(np.min([r["dice"] for r in rows])))
    if args.stages in ("reg", "all"):
        reg = [r["reg_mm"] for r in rows]
        summary.update(reg_mean=float(np.mean(reg)), reg_max=float(np.max(reg)))
    if args.stages in ("detect", "all"):
        n_true, hits = sum(r["n_true"] for r in rows), sum(r["hits"] for r in rows)
        summary.update(lesions=n_true, found=hits, sensitivity=hits / max(n_true, 1),
                       sensitivity_ci95=[round(x, 3) for x in wilson_interval(hits, n_true)],
                       fp_per_case=sum(r["fp"] for r in rows) / len(rows),
                       box_iou=float(np.mean([x for r in rows for x in r["ious"]])) if n_true else None,
                       pirads_accuracy=float(np.mean([r["pirads_ok"] for r in rows])) if "pirads_ok" in rows[0] else None)
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
