"""Does ``labels_match_cine`` pass real segmentations and fail wrong ones? Its statistics per family.

The plausibility check ``labels_match_cine`` (:mod:`bcer.engine.plausibility.cardiac`) judges a
label cine against the cine it was drawn on: LV brighter than the myocardium, little
blood-bright myocardium, an LV ringed by myocardium. This runs ``seg.cardiac`` (default
method) on cines of one family and reports, per labelling, the distribution of the check's
statistics and how many cases it fails:

* ``truth``: the phantom's own labels (must pass);
* ``seg``: ``seg.cardiac``'s labels (must pass: a failure here is a false alarm, unless the
  segmentation is grossly wrong, which the row's LV Dice shows);
* ``eroded``: the truth with the LV cavity eroded two voxels in-plane and the rim given to
  the myocardium (a cavity drawn too small: must fail);
* ``swapped``: the truth with LV and RV labels exchanged (must fail).

Limits were set on the randomised family; ``--family heldout`` only measures, once.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/cardiac_label_check.py --family randomised \
        --seed0 6000 --cases 60 --out benchmarks/results/cardiac_label_check_randomised.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from scipy import ndimage

from bcer.datasets.cardiac import GROUPS, make_cardiac
from bcer.engine.plausibility.cardiac import LabelsCineParams, label_cine_agreement, label_cine_problems
from bcer.metrics import dice
from bcer.tools.registry import call_tool

RESULTS = Path(__file__).parent / "results"
STATS = ("contrast", "bright_myo", "dark_lv", "enclosed")


def eroded(lab: np.ndarray, voxels: int = 2) -> np.ndarray:
    """The LV cavity eroded in-plane by ``voxels``, its rim relabelled myocardium."""
    out, lv = lab.copy(), lab == 3
    core = np.zeros_like(lv)
    for t in range(lab.shape[3]):
        core[..., t] = ndimage.binary_erosion(lv[..., t], np.ones((3, 3, 1), bool), iterations=voxels)
    out[lv & ~core] = 2
    return out


def swapped(lab: np.ndarray) -> np.ndarray:
    out = lab.copy()
    out[lab == 3], out[lab == 1] = 1, 3
    return out


def fails(a: dict[str, float], p: LabelsCineParams) -> list[str]:
    """The names of the limits the check's statistics break (``label_cine_problems``)."""
    return list(label_cine_problems(a, p))


def seg_labels(ph, cache: Path | None, key: str) -> np.ndarray:
    path = None if cache is None else cache / f"{key}.npy"
    if path is not None and path.exists():
        return np.load(path)
    lab = np.asarray(call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]}, {})["labels"].data)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, lab)
    return lab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="randomised", choices=["base", "randomised", "heldout"])
    ap.add_argument("--size", default="small", choices=["small", "full"])
    ap.add_argument("--seed0", type=int, default=6000)
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--borderline-every", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=None, help="seg.cardiac labels per case (.npy)")
    ap.add_argument("--out", type=Path, default=RESULTS / "cardiac_label_check_randomised.json")
    args = ap.parse_args()
    p, t0, rows = LabelsCineParams(), time.time(), []
    for i in range(args.cases):
        seed = args.seed0 + i
        border = bool(args.borderline_every) and i % args.borderline_every == args.borderline_every - 1
        ph = make_cardiac(f"lc{i:03d}", seed, args.size, group=GROUPS[i % 5], family=args.family, borderline=border)
        img, truth = np.asarray(ph.sequences["CINE"].data), np.asarray(ph.labels["seg"].data)
        seg = seg_labels(ph, args.cache, f"{args.family}_{args.size}_{seed}")
        row = {"case": ph.case_id, "seed": seed, "group": ph.truth["group"],
               "dice_lv": round(float(np.mean([dice(seg[..., f] == 3, truth[..., f] == 3)
                                                for f in (ph.truth["ed_frame"], ph.truth["es_frame"])])), 4)}
        for name, lab in (("truth", truth), ("seg", seg), ("eroded", eroded(truth)), ("swapped", swapped(truth))):
            a = label_cine_agreement(img, lab)
            row[name] = {**{k: round(v, 4) for k, v in a.items()}, "fails": fails(a, p)}
        rows.append(row)
    summary = {}
    for name in ("truth", "seg", "eroded", "swapped"):
        s = {"failed": sum(bool(r[name]["fails"]) for r in rows), "of": len(rows)}
        for k in STATS:
            v = np.array([r[name][k] for r in rows], float)
            s[k] = {"min": round(float(np.nanmin(v)), 4), "median": round(float(np.nanmedian(v)), 4),
                    "max": round(float(np.nanmax(v)), 4)}
        summary[name] = s
    report = {"config": {k: str(v) for k, v in vars(args).items()}, "limits": p.model_dump(), "summary": summary,
              "seg_flagged": [{"case": r["case"], "dice_lv": r["dice_lv"], **r["seg"]} for r in rows if r["seg"]["fails"]],
              "wall_s": round(time.time() - t0, 1), "load_avg": os.getloadavg(), "rows": rows}
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
