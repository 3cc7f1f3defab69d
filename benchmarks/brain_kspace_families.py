"""Brain segmentation/grading and k-space reconstruction on one phantom family, tool by tool.

Brain: ``seg.brain_tumor`` Dice (WT/TC/ET) against the truth labels and the grade from
``quant.roi_features`` + ``classify.glioma_grade`` where those tools chain; k-space:
``recon.sense`` and ``recon.grappa`` NRMSE against the fully sampled reference (the file's
``reconstruction_rss`` when written as fastMRI), its ratio to zero filling, and whether the
output matrix equals the header recon matrix (2x readout-oversampled files, every other case).

Usage::

    PYTHONPATH=$PWD python benchmarks/brain_kspace_families.py --family heldout --cases 6
        [--out benchmarks/results/brain_kspace_heldout.json] [--first-seed 700]
        [--compare '{"bias_correction": false}']

``--first-seed`` moves the brain cases to seeds never looked at (a judgement); ``--compare``
runs ``seg.brain_tumor`` a second time on the same cases with those params (e.g. the
previous version's behaviour) and files it beside the default under ``brain_compared``.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcer.datasets.brain import make_brain
from bcer.datasets.kspace import make_kspace_case
from bcer.metrics import dice, nrmse_scaled
from bcer.tools.registry import call_tool, get_tool

_REGIONS = {"wt": (1, 2, 4), "tc": (1, 4), "et": (4,)}


def brain_row(i: int, family: str, size: str, first_seed: int = 700, params: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    grade = ("HGG", "LGG")[i % 2]
    ph = make_brain(f"b{i:03d}", first_seed + i, size, grade=grade, family=family)
    t0 = time.time()
    seg = call_tool("seg.brain_tumor", {k.lower(): ph.sequences[k] for k in ("T1", "T1c", "T2", "FLAIR")},
                    params or {})
    labels = np.asarray(seg["labels"].data)
    truth = np.asarray(ph.labels["seg"].data)
    row: dict[str, Any] = {"case": ph.case_id, "grade": grade, "seconds": round(time.time() - t0, 2)}
    for name, vals in _REGIONS.items():
        a, b = np.isin(labels, vals), np.isin(truth, vals)
        row[f"dice_{name}"] = None if not (a.any() or b.any()) else round(dice(a, b), 4)
    return row


def _domains(family: str) -> tuple[str, ...]:
    """k-space source domains whose generator offers ``family`` (all of them for base)."""
    import inspect

    from bcer.datasets.kspace import KSPACE_SOURCES

    out = []
    for d, (target, *_rest) in KSPACE_SOURCES.items():
        module, func = target.split(":")
        gen = getattr(__import__(module, fromlist=[func]), func)
        if family == "base" or "family" in inspect.signature(gen).parameters:
            out.append(d)
    return tuple(out)


def kspace_row(i: int, family: str, size: str) -> dict[str, Any]:
    domains = _domains(family)
    domain = domains[i % len(domains)]
    over = i % 2 == 0
    ph = make_kspace_case(f"k{i:03d}", 800 + i, size, domain=domain, frames="ed", family=family,
                          readout_oversampling=2.0 if over else 1.0, phase_oversampling=1.14 if over else 1.0)
    ks, ref = ph.sequences["KSPACE"], np.asarray(ph.references["KSPACE"].data)
    zf = call_tool("recon.zero_filled", {"kspace": ks})["image"]
    row: dict[str, Any] = {"case": ph.case_id, "domain": domain, "oversampled": over,
                           "encoded_matrix": list(ks.encoded_matrix), "recon_matrix": ph.metadata["recon_matrix"],
                           "nrmse_zero_filled": round(nrmse_scaled(np.asarray(zf.data), ref), 4)}
    for tool in ("recon.sense", "recon.grappa"):
        t0 = time.time()
        out = call_tool(tool, {"kspace": ks})["image"]
        key = tool.split(".")[1]
        row[f"{key}_matrix_ok"] = list(out.shape[:2]) == list(ph.metadata["recon_matrix"])
        row[f"{key}_nrmse"] = round(nrmse_scaled(np.asarray(out.data), ref), 4)
        row[f"{key}_ratio_vs_zero_filled"] = round(row[f"{key}_nrmse"] / row["nrmse_zero_filled"], 4)
        row[f"{key}_seconds"] = round(time.time() - t0, 2)
    return row


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(float(np.mean(vals)), 4) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="heldout", choices=["base", "randomised", "heldout"])
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--size", default="small", choices=["small", "full"])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--first-seed", type=int, default=700, help="seed of the first brain case")
    ap.add_argument("--compare", type=json.loads, default=None, metavar="JSON",
                    help="seg.brain_tumor params of a second run on the same cases, filed under brain_compared")
    args = ap.parse_args()
    t0 = time.time()
    brain = [brain_row(i, args.family, args.size, args.first_seed) for i in range(args.cases)]
    other = [brain_row(i, args.family, args.size, args.first_seed, args.compare)
             for i in range(args.cases)] if args.compare else None
    kspace = [kspace_row(i, args.family, args.size) for i in range(args.cases)]
    summary = {
        "brain": {k: _mean(brain, k) for k in ("dice_wt", "dice_tc", "dice_et")}
        | {"seconds_median": round(float(np.median([r["seconds"] for r in brain])), 2),
           "seg.brain_tumor": get_tool("seg.brain_tumor").spec.version},
        "kspace": {k: _mean(kspace, k) for k in ("nrmse_zero_filled", "sense_nrmse", "grappa_nrmse",
                                                  "sense_ratio_vs_zero_filled", "grappa_ratio_vs_zero_filled")}
        | {"matrix_ok": all(r["sense_matrix_ok"] and r["grappa_matrix_ok"] for r in kspace)},
    }
    if other:
        summary["brain_compared"] = {"params": args.compare} | {
            k: _mean(other, k) for k in ("dice_wt", "dice_tc", "dice_et")} | {
            "seconds_median": round(float(np.median([r["seconds"] for r in other])), 2)}
    report = {"config": vars(args) | {"out": str(args.out)}, "summary": summary, "brain": brain, "kspace": kspace,
              "wall_s": round(time.time() - t0, 1), "load_avg": os.getloadavg()}
    if other:
        report["brain_compared"] = other
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
