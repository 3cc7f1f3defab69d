"""Frames where seg.cardiac's hybrid merge loses the LV, before and after ``restore_lost_frames``.

Per randomised (or base) cine (never held-out): the classical labels and the shipped
network's once, then the 2.5 merge (``merge_hybrid`` alone) and the 2.6 one (with
:func:`bcer.tools.seg.cardiac.restore_lost_frames`) side by side: the frames restored, the
worst per-frame LV Dice against the truth, the LV Dice over the cine, whether ED/ES
(``cardiac.ed_es`` with the cine) are exact, the EF error at those frames (the chain's EF), and
the smallest frame's LV over the largest's (``cavities_every_frame`` fails below 0.1).

    .venv/bin/python benchmarks/cardiac_lost_frames.py --seed0 6000 --cases 60 \
        --out benchmarks/results/cardiac_lost_frames6000.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np

from bcer.contracts.artifacts import Mask
from bcer.datasets.cardiac import family_ranges, make_cardiac
from bcer.metrics import dice
from bcer.tools.registry import call_tool
from bcer.tools.seg import cardiac as sc
from bcer.tools.seg.bundle import shipped_bundle
from bcer.tools.seg.cardiac_classical import classical_labels

GROUPS = ["NOR", "DCM", "HCM", "MINF", "RV"]
RESULTS = Path(__file__).parent / "results"


def _scores(lab: np.ndarray, ph) -> dict:
    truth = np.asarray(ph.labels["seg"].data)
    per_frame = [dice(lab[..., t] == 3, truth[..., t] == 3) for t in range(truth.shape[3])]
    mask = Mask(lab, ph.labels["seg"].affine)
    phases = call_tool("cardiac.ed_es", {"labels": mask, "cine": ph.sequences["CINE"]})["phases"]
    fn = call_tool("quant.cardiac_function", {"labels": mask, "phases": phases})["function"].rows[0]
    curve = np.count_nonzero(lab == 3, axis=(0, 1, 2)).astype(float)
    row = phases.rows[0]
    return {"min_frame_dice_lv": round(float(min(per_frame)), 4), "dice_lv": round(dice(lab == 3, truth == 3), 4),
            "min_frame_fraction_lv": round(float(curve.min() / curve.max()), 4),
            "ed_es_exact": (row["ed_frame"], row["es_frame"]) == (ph.truth["ed_frame"], ph.truth["es_frame"]),
            "ef_error_pts": round(abs(float(fn["lv_ef_pct"]) - float(ph.truth["lv_ef_pct"])), 3)}


def case(seed: int, i: int, family: str = "randomised") -> dict:
    with family_ranges(family) if family != "base" else contextlib.nullcontext():
        ph = make_cardiac(f"lf{i:03d}", seed, "small", group=GROUPS[i % 5], family=family, borderline=i % 3 == 2)
    cine = ph.sequences["CINE"]
    box = sc.content_box(np.asarray(cine.data))
    canon, ornt = sc._canonical(sc._crop(cine, box))
    cl, _ = classical_labels(canon, sc.CardiacParams().max_wall_mm)
    net, _ = sc._network(canon, np.asarray(canon.data), sc.CardiacParams(), "cpu", str(shipped_bundle()))
    if sc.network_problem(net):
        return {"seed": seed, "network_fallback": True}
    def back(lab: np.ndarray) -> np.ndarray:
        return sc.to_stored_grid(lab, np.shape(cine.data), box, ornt)

    old = sc.merge_hybrid(cl, net)
    new = old.copy()
    restored = sc.restore_lost_frames(new, net)
    row = {"seed": seed, "restored_frames": restored, "before": _scores(back(old), ph)}
    row["after"] = row["before"] if not restored else _scores(back(new), ph)
    return row


def summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if "before" in r]
    out = {"cines": len(rows), "network_fallback": len(rows) - len(ok),
           "cines_restored": sum(bool(r["restored_frames"]) for r in ok),
           "frames_restored": sum(len(r["restored_frames"]) for r in ok)}
    for k in ("before", "after"):
        out[k] = {"ed_es_exact": round(float(np.mean([r[k]["ed_es_exact"] for r in ok])), 4),
                  "mean_ef_error_pts": round(float(np.mean([r[k]["ef_error_pts"] for r in ok])), 3),
                  "max_ef_error_pts": round(float(np.max([r[k]["ef_error_pts"] for r in ok])), 3),
                  "mean_dice_lv": round(float(np.mean([r[k]["dice_lv"] for r in ok])), 4),
                  "worst_frame_dice_lv": round(float(np.min([r[k]["min_frame_dice_lv"] for r in ok])), 4),
                  "cines_with_a_frame_below_0.5": sum(r[k]["min_frame_dice_lv"] < 0.5 for r in ok),
                  "cines_failing_cavities_every_frame": sum(r[k]["min_frame_fraction_lv"] < 0.1 for r in ok)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed0", type=int, default=6000)
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--family", default="randomised", choices=["randomised", "base"], help="never heldout")
    ap.add_argument("--out", type=Path, default=RESULTS / "cardiac_lost_frames.json")
    args = ap.parse_args()
    t0 = time.time()
    rows = [case(args.seed0 + i, i, args.family) for i in range(args.cases)]
    report = {"config": {k: str(v) for k, v in vars(args).items()}, "family": args.family,
              "summary": summary(rows), "wall_s": round(time.time() - t0, 1), "load_avg": os.getloadavg(),
              "cases": rows}
    print(json.dumps(report["summary"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
