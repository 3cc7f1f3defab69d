"""The cardiac chain (seg.cardiac -> cardiac.ed_es -> quant.cardiac_function ->
classify.cardiac_acdc) on cine phantoms of one family, tool by tool (no Ray, no engine).

Per case: Dice (LV, MYO, RV at the true ED and ES), ED/ES exact (frame index equal to the
truth's), ED/ES exact-or-tied (also when the chosen frame's true LV
voxel count equals the truth frame's: a tie in the truth's own definition, which keeps the
earlier frame only because ``argmax`` does), ED/ES "equivalent" (the chosen frame's *true* LV volume is within 0.5 % of EDV of
the true extreme, i.e. a tie in the truth itself), EF error (points), ACDC group right.

Usage::

    PYTHONPATH=$PWD python benchmarks/cardiac_families.py --family heldout --cases 20 [--size small]
        [--borderline-every 3] [--bundle DIR] [--out benchmarks/results/cardiac_heldout60.json]

``--family heldout`` only measures; never tune anything on its numbers.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcer.datasets.cardiac import GROUPS, family_ranges, make_cardiac
from bcer.metrics import dice, frame_match
from bcer.tools.registry import call_tool

TIE_FRACTION_OF_EDV = 0.005


def run_case(ph, bundle: str | None, method: str = "auto") -> dict[str, Any]:
    cine, truth = ph.sequences["CINE"], ph.truth
    t0 = time.time()
    params = {"bundle_dir": bundle, "method": method} if bundle else {"method": method}
    seg = call_tool("seg.cardiac", {"cine": cine}, params)["labels"]
    phases = call_tool("cardiac.ed_es", {"labels": seg, "cine": cine})["phases"]
    fn = call_tool("quant.cardiac_function", {"labels": seg, "phases": phases},
                   {"height_cm": ph.metadata["height"], "weight_kg": ph.metadata["weight"]})["function"]
    group = call_tool("classify.cardiac_acdc", {"function": fn})["classification"]
    row = fn.rows[0]
    ed, es = phases.rows[0]["ed_frame"], phases.rows[0]["es_frame"]
    curve = truth["lv_volume_curve_ml"]
    lab, got = np.asarray(ph.labels["seg"].data), np.asarray(seg.data)
    d = {}
    for name, k in (("rv", 1), ("myo", 2), ("lv", 3)):
        d[name] = float(np.mean([dice(got[..., f] == k, lab[..., f] == k)
                                 for f in (truth["ed_frame"], truth["es_frame"])]))
    return {
        "case": ph.case_id, "group": truth["group"], "borderline": bool(truth.get("borderline")),
        "n_frames": truth["n_frames"], "ed_true": truth["ed_frame"], "es_true": truth["es_frame"],
        "ed": ed, "es": es, "ed_es_exact": float(ed == truth["ed_frame"] and es == truth["es_frame"]),
        "ed_es_exact_or_tied": float(frame_match(ed, truth["ed_frame"], curve)
                                     and frame_match(es, truth["es_frame"], curve)),
        "ed_es_equivalent": float(frame_match(ed, truth["ed_frame"], curve, TIE_FRACTION_OF_EDV)
                                  and frame_match(es, truth["es_frame"], curve, TIE_FRACTION_OF_EDV)),
        "ef_true": round(truth["lv_ef_pct"], 2), "ef": round(row["lv_ef_pct"], 2),
        "ef_error_pts": round(abs(row["lv_ef_pct"] - truth["lv_ef_pct"]), 3),
        "group_pred": group.label, "group_ok": float(group.label == truth["group"]),
        "dice": {k: round(v, 4) for k, v in d.items()}, "seconds": round(time.time() - t0, 2),
        "acquisition": truth.get("acquisition"), "ed_es_margin_ml": truth.get("ed_es_margin_ml"),
        "seg_method": seg.meta.get("method"), "seg_fallback": seg.meta.get("fallback"),
        "ed_es_confidence": phases.rows[0].get("ed_es_confidence"),
        "ed_es_ambiguous": phases.rows[0].get("ed_es_ambiguous"),
        "ef_range_pts": (round(row["lv_ef_max_pct"] - row["lv_ef_min_pct"], 3) if "lv_ef_max_pct" in row else None),
        "phase_ef_cost_pts": phase_ef_cost(got, ed, es, truth["ed_frame"], truth["es_frame"]),
        "seg_network_frames": seg.meta.get("network_frames", []),
        "labels_match_cine": labels_check(cine, got),
    }


def phase_ef_cost(labels: np.ndarray, ed: int, es: int, ed_true: int, es_true: int) -> float:
    """|EF at the chosen frames - EF at the true frames| on the same (the chain's) labels, in
    points: what the ED/ES choice alone costs the EF, segmentation error left out."""
    from bcer.tools.quant import ejection_fraction

    lv = np.count_nonzero(labels == 3, axis=(0, 1, 2)).astype(float)
    return round(abs(ejection_fraction(lv[ed], lv[es]) - ejection_fraction(lv[ed_true], lv[es_true])), 3)


def labels_check(cine, labels: np.ndarray) -> dict[str, Any]:
    """The ``labels_match_cine`` plausibility check's statistics and verdict on the chain's labels."""
    from bcer.engine.plausibility.cardiac import LabelsCineParams, label_cine_agreement, label_cine_problems

    a = label_cine_agreement(np.asarray(cine.data), labels)
    return {**{k: round(v, 4) for k, v in a.items()}, "ok": not label_cine_problems(a, LabelsCineParams())}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str, sub: list[dict[str, Any]] | None = None) -> float | None:
        vals = [r[key] for r in (rows if sub is None else sub)]
        return round(float(np.mean(vals)), 4) if vals else None
    border = [r for r in rows if r["borderline"]]
    plain = [r for r in rows if not r["borderline"]]
    return {
        "cases": len(rows), "ed_es_exact": mean("ed_es_exact"),
        "ed_es_exact_or_tied": mean("ed_es_exact_or_tied") if all("ed_es_exact_or_tied" in r for r in rows) else None,
        "ed_es_equivalent": mean("ed_es_equivalent"),
        "ef_error_pts_mean": mean("ef_error_pts"),
        "ef_error_pts_max": round(max(r["ef_error_pts"] for r in rows), 3) if rows else None,
        "group_accuracy": mean("group_ok"), "group_accuracy_borderline": mean("group_ok", border),
        "group_accuracy_other": mean("group_ok", plain),
        "dice": {k: round(float(np.mean([r["dice"][k] for r in rows])), 4) for k in ("lv", "myo", "rv")},
        "median_case_s": round(float(np.median([r["seconds"] for r in rows])), 2),
        **flag_summary(rows),
    }


def flag_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """ED/ES exact among the picks cardiac.ed_es flags ambiguous and the rest; the
    labels_match_cine check's failures (cases, LV Dice). Empty for rows without the fields."""
    if not rows or not all(r.get("ed_es_ambiguous") is not None for r in rows):
        return {}
    amb = [r for r in rows if r["ed_es_ambiguous"]]
    clear = [r for r in rows if not r["ed_es_ambiguous"]]
    out: dict[str, Any] = {
        "ed_es_flagged_ambiguous": len(amb),
        "ed_es_exact_when_flagged": round(float(np.mean([r["ed_es_exact"] for r in amb])), 4) if amb else None,
        "ed_es_exact_when_not": round(float(np.mean([r["ed_es_exact"] for r in clear])), 4) if clear else None,
        "ed_es_mean_confidence": round(float(np.mean([r["ed_es_confidence"] for r in rows])), 4)}
    missed = [r for r in rows if not r["ed_es_exact"] and r.get("phase_ef_cost_pts") is not None]
    if missed:
        cost = [r["phase_ef_cost_pts"] for r in missed]
        out["phase_ef_cost_pts_when_missed"] = {"cases": len(cost), "median": round(float(np.median(cost)), 3),
                                                "max": round(float(np.max(cost)), 3)}
    ranges = [r["ef_range_pts"] for r in amb if r.get("ef_range_pts") is not None]
    if ranges:
        out["ef_range_pts_when_flagged"] = {"median": round(float(np.median(ranges)), 3),
                                            "max": round(float(np.max(ranges)), 3)}
    if all("labels_match_cine" in r for r in rows):
        out["labels_match_cine_failed"] = [{"case": r["case"], "dice_lv": r["dice"]["lv"]}
                                           for r in rows if not r["labels_match_cine"]["ok"]]
    return out


def rescore(path: Path) -> None:
    """Score a stored run's ED/ES picks with ``frame_match`` ties: only the phantoms' truth is
    regenerated (same config, same seeds), no tool runs, so nothing about the tools is learnt."""
    report = json.loads(path.read_text())
    cfg = report["config"]
    every = cfg["borderline_every"]
    for i, row in enumerate(report["rows"]):
        ph = make_cardiac(row["case"], cfg["seed0"] + i, cfg["size"], group=GROUPS[i % 5], family=cfg["family"],
                          borderline=bool(every) and i % every == every - 1)
        t = ph.truth
        assert (t["ed_frame"], t["es_frame"]) == (row["ed_true"], row["es_true"]), f"{row['case']}: not the same phantom"
        curve = t["lv_volume_curve_ml"]
        row["ed_es_exact_or_tied"] = float(frame_match(row["ed"], t["ed_frame"], curve)
                                           and frame_match(row["es"], t["es_frame"], curve))
        row["ed_es_gap_pct_edv"] = [round(100 * abs(curve[row["ed"]] - curve[t["ed_frame"]]) / max(curve), 3),
                                    round(100 * abs(curve[row["es"]] - curve[t["es_frame"]]) / max(curve), 3)]
    report["summary"]["ed_es_exact_or_tied"] = summarise(report["rows"])["ed_es_exact_or_tied"]
    report["rescored"] = "ed_es_exact_or_tied and ed_es_gap_pct_edv added by --rescore (truth regenerated, no tool run)"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="heldout", choices=["base", "randomised", "heldout"])
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--size", default="small", choices=["small", "full"])
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--borderline-every", type=int, default=3, help="every Nth case is borderline (0: none)")
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--method", default="auto", choices=["auto", "network", "classical", "hybrid"],
                    help="seg.cardiac method (auto: the shipped network, classical fallback)")
    ap.add_argument("--atrium", type=float, default=None,
                    help="override the family's probability of a left atrium above the base "
                         "(randomised: 0.5, heldout: 0; 1 = a stress test)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rescore", type=Path, default=None,
                    help="add ed_es_exact_or_tied to this result file's rows from the regenerated truth (no tool runs)")
    args = ap.parse_args()
    if args.rescore:
        rescore(args.rescore)
        return
    logging.basicConfig(level=logging.WARNING)
    pinned = {} if args.atrium is None else {"atrium": args.atrium}
    rows = []
    t0 = time.time()
    for i in range(args.cases):
        border = bool(args.borderline_every) and i % args.borderline_every == args.borderline_every - 1
        with family_ranges(args.family, **pinned):
            ph = make_cardiac(f"{args.family[:2]}{i:03d}", args.seed0 + i, args.size, group=GROUPS[i % 5],
                              family=args.family, borderline=border)
        try:
            row = run_case(ph, args.bundle, args.method)
        except Exception as e:  # a failed case is a row, not the end of the measurement
            row = {"case": ph.case_id, "group": ph.truth["group"], "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(row))
            continue
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("case", "group", "borderline", "ed_true", "es_true", "ed", "es",
                                              "ef_true", "ef", "group_pred", "dice")}), flush=True)
    failed = args.cases - len(rows)
    report = {"config": vars(args) | {"out": str(args.out)}, "summary": summarise(rows) | {"failed": failed},
              "rows": rows, "wall_s": round(time.time() - t0, 1), "load_avg": os.getloadavg()}
    print(json.dumps(report["summary"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
