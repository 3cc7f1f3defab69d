"""Which acquisition or anatomy nuisance costs the cardiac chain? One nuisance pinned at a time.

The randomised cardiac family draws every nuisance from a range (``FAMILY_RANGES``). Here one
field at a time is pinned to the edge of its randomised range (or a little beyond it, marked
``beyond``), every other draw staying as it was: a pinned range still consumes its random
draw, so case ``k`` of every condition has the same heart, group and other nuisances, and the
conditions are paired. Each case runs the whole chain (``cardiac_families.run_case``:
seg.cardiac -> cardiac.ed_es -> quant -> classify) and the table gives Dice (LV, MYO, RV),
ED/ES exact, EF error and group accuracy per condition.

The "beyond" values are generic extrapolations (a range's edge times a factor), chosen without
reference to the held-out family's numbers. Randomised family only; nothing here is tuned.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python benchmarks/cardiac_stress.py --cases 10 \
        --out benchmarks/results/cardiac_stress.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import bcer.datasets.cardiac as C  # noqa: E402
from bcer.datasets.cardiac import GROUPS, family_ranges, make_cardiac  # noqa: E402
from cardiac_families import run_case, summarise  # noqa: E402

BASE = C.FAMILY_RANGES["randomised"]


# name -> FamilyRanges overrides (a (v, v) range pins the draw to v)
CONDITIONS: dict[str, dict[str, Any]] = {
    "randomised": {},
    "gre_contrast": {"contrast_mix": (1.0, 1.0)},
    "bssfp_contrast": {"contrast_mix": (0.0, 0.0)},
    "coarse_pixels": {"spacing_mm": {**BASE.spacing_mm, "small": (3.4, 3.4)}},
    "coarse_pixels_beyond": {"spacing_mm": {**BASE.spacing_mm, "small": (3.4 * 1.1, 3.4 * 1.1)}},
    "thin_slices": {"slice_mm": {**BASE.slice_mm, "small": (9.0, 9.0)}},
    "oblique_15": {"oblique_deg": (15.0, 15.0)},
    "oblique_beyond": {"oblique_deg": (15.0 * 1.4, 15.0 * 1.4)},
    "off_centre_45": {"heart_offset_mm": (45.0, 45.0)},
    "noise_0.06": {"noise": (0.06, 0.06)},
    "bias_0.4": {"bias": (0.4, 0.4)},
    "liver_fat_3.5": {"liver": 1.0, "fat": 1.0, "pericardial_fat_mm": (3.5, 3.5)},
    "slice_profile": {"slice_profile": 1.0},
    "blur_0.9": {"blur_vox": (0.9, 0.9)},
    "many_frames": {"frames": {**BASE.frames, "small": (20, 20)}},
    "few_frames": {"frames": {**BASE.frames, "small": (9, 9)}},
    "liver_only": {"liver": 1.0, "fat": 0.0},
    "fat_3.5_only": {"liver": 0.0, "fat": 1.0, "pericardial_fat_mm": (3.5, 3.5)},
    "fat_2_only": {"liver": 0.0, "fat": 1.0, "pericardial_fat_mm": (2.0, 2.0)},
    "no_liver_no_fat": {"liver": 0.0, "fat": 0.0},
}


def run_condition(name: str, cases: int, seed0: int, every: int, bundle: str | None = None,
                  method: str = "auto") -> dict[str, Any]:
    rows, errors = [], []
    for i in range(cases):
        border = bool(every) and i % every == every - 1
        with family_ranges("randomised", **CONDITIONS[name]):
            ph = make_cardiac(f"st{i:03d}", seed0 + i, "small", group=GROUPS[i % 5], family="randomised",
                              borderline=border)
        try:
            rows.append(run_case(ph, bundle, method))
        except Exception as e:  # a failed case is counted, not the end of the measurement
            errors.append({"case": ph.case_id, "error": f"{type(e).__name__}: {e}"})
    out = summarise(rows) | {"failed": len(errors), "errors": errors}
    out["rv_dice_per_case"] = [r["dice"]["rv"] for r in rows]
    out["rows"] = [{k: r[k] for k in ("case", "group", "n_frames", "ed_true", "es_true", "ed", "es", "ef_true", "ef",
                                      "group_pred", "dice")} for r in rows]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10)
    ap.add_argument("--seed0", type=int, default=5000)
    ap.add_argument("--borderline-every", type=int, default=3)
    ap.add_argument("--bundle", default=None, help="seg.cardiac bundle folder (default: the shipped one)")
    ap.add_argument("--method", default="auto", choices=["auto", "network", "classical", "hybrid"],
                    help="seg.cardiac method (with --bundle, 'hybrid' is what auto does with the shipped one)")
    ap.add_argument("--only", nargs="*", default=None, help="run these conditions only")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    names = args.only or list(CONDITIONS)
    if args.out and args.out.exists() and args.only:  # add conditions to an earlier table
        table_before = json.loads(args.out.read_text()).get("table", {})
    else:
        table_before = {}
    t0, table = time.time(), {}
    for name in names:
        t = time.time()
        table[name] = run_condition(name, args.cases, args.seed0, args.borderline_every, args.bundle, args.method)
        s = table[name]
        print(f"{name:22s} Dice LV {s['dice']['lv']:.3f} MYO {s['dice']['myo']:.3f} RV {s['dice']['rv']:.3f} "
              f"ED/ES {s['ed_es_exact']:.2f} EF err {s['ef_error_pts_mean']:.2f} group {s['group_accuracy']:.2f} "
              f"failed {s['failed']} ({time.time() - t:.0f} s)", flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"what": __doc__.split("\n\n")[0], "command": " ".join(sys.argv), "commit": commit,
              "conditions": CONDITIONS, "config": vars(args) | {"out": str(args.out)},
              "table": table_before | table,
              "wall_s": round(time.time() - t0, 1), "load_avg": os.getloadavg()}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
