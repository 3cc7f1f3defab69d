"""How the default segmenters do on a family they never saw: ``benchmarks/results/segmenters_lofo.json``.

The cases come from ``bcer.datasets.independent``: shape and image models written apart from
every generator the defaults were trained or tuned on, with ranges fixed in code before any
score was looked at. They are written in the layouts bcer reads (ACDC, DICOM series, BraTS)
and run through the real tasks (``cardiac_report``, ``prostate_report``, ``brain_report``)
with the shipped default methods, on Ray, as ``bcer bench --data`` does. Per domain the file
holds Dice per structure, the clinical numbers and their error against the truth, SR (all
checks) and SR delivered, the issue's targets with met / not met, and the ``low_confidence``
flag table over the delivered cases.

"Right" is defined here, before any run, and is not changed after:
cardiac: LVEF error <= 5 points; prostate: gland Dice >= 0.85; brain: WT Dice >= 0.92.

Of the defaults only ``seg.prostate`` was replaced (by an ensemble judged on fresh cases under
``runs``; no GPU, two CPU cores). ``--candidate TOOL=DIR`` scores
a retrained model instead (the fold that leaves the independent family out:
``scripts/train_prostate_dr.py``, ``train_cardiac_dr.py``, ``train_brain_dr.py``) and files its
table under ``candidates``, beside the defaults'. ``--label NAME`` files a run under
``runs.NAME`` instead, with the versions of the segmenters it ran: a method change scored on
fresh cases (another ``--seed``) beside the method it replaces, run from a checkout of each;
with ``--candidate``, a retrained model on those cases.
One thread, one case per task in flight; about 5-10 min on a shared 2-core machine for 10
cases per domain.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/segmenters_lofo.py --cases 10
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/segmenters_lofo.py --cases 10 --tasks prostate_report \
        --candidate seg.prostate=benchmarks/models/prostate_unet3d_dr
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "segmenters_lofo.json"
TASKS = ("cardiac_report", "prostate_report", "brain_report")
RIGHT = {"cardiac_report": "LVEF error <= 5 points", "prostate_report": "gland Dice >= 0.85",
         "brain_report": "WT Dice >= 0.92"}
# the targets on families the model never saw: (metric, ">=" | "<=", value)
TARGETS = {
    "cardiac_report": [("dice_lv", ">=", 0.90), ("dice_myo", ">=", 0.80), ("dice_rv", ">=", 0.85),
                       ("lvef_error_pts", "<=", 5.0), ("group_accuracy", ">=", 0.8)],
    "prostate_report": [("gland_dice", ">=", 0.85), ("lesions_found", ">=", 0.8)],
    "brain_report": [("dice_wt", ">=", 0.92), ("dice_wt_multifocal", ">=", 0.92), ("dice_et", ">=", 0.80)],
}
NOTE = ("synthetic phantoms only; of the defaults only seg.prostate was replaced (prostate_unet3d 0.3.0, an ensemble "
        "judged on fresh cases under 'runs'); the fold that leaves this family out was trained per domain and is "
        "scored under 'candidates'; other folds: cardiac_dr_fold_heldout.json, prostate_dr_fold_heldout.json")


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _row_value(doc: Any, column: str) -> float | None:
    for row in (doc or {}).get("rows", []):
        if row.get(column) is not None:
            return float(row[column])
    return None


def _err(got: float | None, want: float | None) -> float | None:
    return None if got is None or want is None else round(abs(got - want), 3)


def cardiac_numbers(case_dir: Path, truth: dict[str, Any]) -> dict[str, Any]:
    fn = _json(case_dir / "function.json")
    out: dict[str, Any] = {}
    for key in ("lv_ef_pct", "rv_ef_pct", "lv_edv_ml", "lv_esv_ml", "rv_edv_ml", "rv_esv_ml"):
        got = _row_value(fn, key)
        out[key] = {"got": None if got is None else round(got, 2), "true": round(truth[key], 2),
                    "error": _err(got, truth[key])}
    grp = _json(case_dir / "acdc_group.json") or {}
    out["group"] = {"got": grp.get("label"), "true": truth["group"]}
    return out


def _gland_ml(case_dir: Path) -> float | None:
    path = case_dir / "gland.nii.gz"
    if not path.exists():
        return None
    import nibabel as nib

    img = nib.load(str(path))
    return float((np.asarray(img.dataobj) > 0).sum() * abs(np.linalg.det(img.affine[:3, :3])) / 1000.0)


def prostate_numbers(case_dir: Path, truth: dict[str, Any], quality: dict[str, Any]) -> dict[str, Any]:
    got = _gland_ml(case_dir)
    items = (_json(case_dir / "lesions.json") or {}).get("items")
    n_true = len(truth["lesions"])
    sens = quality.get("lesion_sensitivity")
    return {"gland_volume_ml": {"got": None if got is None else round(got, 2), "true": round(truth["gland_volume_ml"], 2),
                                "error": _err(got, truth["gland_volume_ml"]),
                                "error_pct": None if got is None else round(100 * abs(got - truth["gland_volume_ml"])
                                                                            / truth["gland_volume_ml"], 1)},
            "lesion_count": {"got": None if items is None else len(items), "true": n_true},
            "lesions_found": None if sens is None else int(round(sens * n_true))}


def brain_numbers(case_dir: Path, truth: dict[str, Any]) -> dict[str, Any]:
    doc = _json(case_dir / "features.json") or {}
    whole = (doc.get("meta") or {}).get("whole") or {}
    side = whole.get("side")
    if side is None:  # no union row: the sides the per-compartment rows give
        sides = sorted({str(r.get("side")) for r in doc.get("rows", []) if r.get("side")})
        side = sides[0] if len(sides) == 1 else ("/".join(sides) or None)
    name = {"R": "right", "L": "left"}.get(str(side), side)
    return {"side": {"got": name, "true": truth["side"], "right_share_true": round(truth["right_share"], 3),
                     "ok": name == truth["side"]},
            "n_foci": {"got": whole.get("n_foci"), "true": truth["n_foci"]}, "kind": truth["kind"],
            "orientation": truth["orientation"],
            "grade": {"got": (_json(case_dir / "grade.json") or {}).get("label"), "true": truth["grade"]}}


def is_right(task: str, c: dict[str, Any]) -> bool | None:
    q = c["quality"]
    if task == "cardiac_report":
        e = c["numbers"]["lv_ef_pct"]["error"]
        return None if e is None else e <= 5.0
    if task == "prostate_report":
        return None if q.get("gland_dice") is None else q["gland_dice"] >= 0.85
    return None if q.get("dice_wt") is None else q["dice_wt"] >= 0.92


def flag_table(task: str, cases: list[dict[str, Any]]) -> dict[str, Any]:
    t = {"flagged_wrong": 0, "flagged_right": 0, "unflagged_wrong": 0, "unflagged_right": 0, "not_delivered": 0,
         "no_flag_reported": 0}
    for c in cases:
        if not c["sr_delivered"]:
            t["not_delivered"] += 1
        elif c["low_confidence"] is None or c["right"] is None:
            t["no_flag_reported"] += 1
        else:
            t[f"{'flagged' if c['low_confidence'] else 'unflagged'}_{'right' if c['right'] else 'wrong'}"] += 1
    return {"right_means": RIGHT[task], **t}


def _mean(vals: list[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return round(float(np.mean(v)), 4) if v else None


def summary(task: str, cases: list[dict[str, Any]]) -> dict[str, Any]:
    delivered = [c for c in cases if c["sr_delivered"]]
    q = lambda k, cs=delivered: _mean([c["quality"].get(k) for c in cs])
    s: dict[str, Any] = {"cases": len(cases), "sr": round(float(np.mean([c["sr"] for c in cases])), 4),
                         "sr_delivered": round(float(np.mean([c["sr_delivered"] for c in cases])), 4)}
    if task == "cardiac_report":
        s.update({k: q(k) for k in ("dice_lv", "dice_myo", "dice_rv", "group_accuracy", "ed_es_exact")})
        for key, name in (("lv_ef_pct", "lvef_error_pts"), ("rv_ef_pct", "rvef_error_pts"),
                          ("lv_edv_ml", "lv_edv_error_ml"), ("lv_esv_ml", "lv_esv_error_ml")):
            errs = [c["numbers"][key]["error"] for c in delivered if c["numbers"][key]["error"] is not None]
            s[name] = _mean(errs)
            s[name + "_max"] = round(max(errs), 3) if errs else None
    elif task == "prostate_report":
        s["gland_dice"] = q("gland_dice")
        s["gland_volume_error_pct"] = _mean([c["numbers"]["gland_volume_ml"]["error_pct"] for c in delivered])
        n_true = sum(c["numbers"]["lesion_count"]["true"] for c in cases)
        found = sum(c["numbers"]["lesions_found"] or 0 for c in delivered)
        s.update(true_lesions=n_true, found=found, lesions_found=round(found / n_true, 4) if n_true else None,
                 lesion_count_exact=_mean([float(c["numbers"]["lesion_count"]["got"] == c["numbers"]["lesion_count"]["true"])
                                           for c in delivered]),
                 lesion_false_positives_per_case=q("lesion_false_positives"))
    else:
        s.update({k: q(k) for k in ("dice_wt", "dice_tc", "dice_et", "grade_accuracy")})
        s["dice_wt_multifocal"] = q("dice_wt", [c for c in delivered if c["numbers"]["kind"] == "multifocal"])
        s["side_right"] = f"{sum(bool(c['numbers']['side']['ok']) for c in delivered)}/{len(delivered)}"
    s["targets"] = [{"metric": m, "target": f"{op} {v:g}", "value": s.get(m),
                     "met": None if s.get(m) is None else bool(s[m] >= v if op == ">=" else s[m] <= v)}
                    for m, op, v in TARGETS[task]]
    return s


HEADLINE = {"cardiac_report": ("sr", "sr_delivered", "dice_lv", "dice_myo", "dice_rv", "lvef_error_pts",
                               "rvef_error_pts", "group_accuracy"),
            "prostate_report": ("sr", "sr_delivered", "gland_dice", "gland_volume_error_pct", "lesions_found"),
            "brain_report": ("sr", "sr_delivered", "dice_wt", "dice_wt_multifocal", "dice_et", "side_right")}


def headline(domains: dict[str, Any]) -> dict[str, Any]:
    """The few numbers per domain that docs/results.md shows (``table``), with the flag table
    in one line: how many of the wrong and of the right delivered answers were flagged."""
    out = {}
    for task, d in domains.items():
        f = d["low_confidence"]
        wrong, right = f["flagged_wrong"] + f["unflagged_wrong"], f["flagged_right"] + f["unflagged_right"]
        out[task] = {**{k: d["summary"].get(k) for k in HEADLINE[task]},
                     "low_confidence": f"flags {f['flagged_wrong']}/{wrong} wrong, {f['flagged_right']}/{right} right"}
    return out


def case_record(task: str, row: dict[str, Any], case: Any, run_dir: Path, flags: dict[str, Any]) -> dict[str, Any]:
    truth = (case.ground_truth or {}).get("values", {})
    case_dir = run_dir / row["case"]
    quality = row.get("quality") or {}
    numbers = (cardiac_numbers(case_dir, truth) if task == "cardiac_report"
               else prostate_numbers(case_dir, truth, quality) if task == "prostate_report"
               else brain_numbers(case_dir, truth))
    rec = {"case": row["case"], "status": row["status"], "sr": int(row["sr"] or 0),
           "sr_delivered": int(row["sr_delivered"] or 0), "error": row.get("error_message"),
           "quality": quality, "numbers": numbers, "low_confidence": flags.get(row["case"])}
    rec["right"] = is_right(task, rec) if rec["sr_delivered"] else None
    return rec


SEGMENTER = {"cardiac_report": "seg.cardiac", "prostate_report": "seg.prostate", "brain_report": "seg.brain_tumor"}


def _versions(tasks: tuple[str, ...]) -> dict[str, str]:
    """The version of each task's segmenter in the bcer this run imported."""
    from bcer.tools.registry import get_tool

    return {SEGMENTER[t]: get_tool(SEGMENTER[t]).spec.version for t in tasks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10, help="cases per domain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bcer_independent"))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="domains to run (default: all)")
    ap.add_argument("--candidate", metavar="TOOL=DIR", default=None,
                    help="score a retrained candidate instead of the default (e.g. seg.prostate=benchmarks/models/"
                         "prostate_unet3d_dr); its table goes under 'candidates' in --out, beside the defaults'")
    ap.add_argument("--label", default=None,
                    help="file this run under 'runs.LABEL' in --out (with the segmenters' versions) instead of "
                         "replacing the defaults' table: e.g. a method change on fresh cases (--seed 1)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="TOOL.PARAM=VALUE",
                    help="a tool parameter on every step of that tool (as the CLI's --set), e.g. "
                         "seg.cardiac.min_myo_volume_ratio=0 to run a check switched off; recorded in the command")
    args = ap.parse_args()
    tasks = tuple(args.tasks)
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(1)
    from bcer.bench import run_bench
    from bcer.datasets.independent import write_family
    from bcer.overrides import parse_sets

    if args.work.exists():
        shutil.rmtree(args.work)
    t0 = time.time()
    written = write_family(args.work / "data", args.cases, tasks, args.seed)
    synth_s = time.time() - t0
    flags: dict[str, dict[str, Any]] = {t: {} for t in tasks}

    def done(row: dict[str, Any]) -> None:  # the cohort row carries the segmenter's own flag
        flags.setdefault(row.get("task") or "", {})[row["case"]] = row.get("low_confidence")
        print(f"  {row.get('task')}/{row['case']}: {row['status']} ({time.time() - t0:.0f} s)", flush=True)

    bundles = dict([args.candidate.split("=", 1)]) if args.candidate else None
    params = parse_sets(args.sets) or None
    report = run_bench(list(tasks), args.cases, args.work / "bench", data=args.work / "data", seed=args.seed,
                       max_in_flight=1, on_case_done=done, bundles=bundles, params=params)
    doc: dict[str, Any] = {
        "what": "the shipped default segmenters through cardiac_report, prostate_report and brain_report on the "
                "independent evaluation family (bcer.datasets.independent), which no default was trained or tuned on",
        "note": NOTE,
        "right_defined_before_running": RIGHT,
        "command": f"OMP_NUM_THREADS=1 python benchmarks/segmenters_lofo.py --cases {args.cases}"
                   + (f" --seed {args.seed}" if args.seed else ""),
        "machine": f"{platform.machine()}, 1 torch thread, one case per task in flight (three at once), shared 2-core machine, no GPU",
        "synth_s": round(synth_s, 1), "wall_s": None, "date": time.strftime("%Y-%m-%d"),
        "table": {}, "domains": {},
    }
    for task in tasks:
        by_id = {c.id: c for c in written[task]}
        rows = [r for r in report["cases"] if r["task"] == task]
        run_dir = args.work / "bench" / "runs" / task
        cases = [case_record(task, r, by_id[r["case"]], run_dir, flags[task]) for r in rows]
        doc["domains"][task] = {"summary": summary(task, cases), "low_confidence": flag_table(task, cases),
                                "cases": cases}
    doc["table"] = headline(doc["domains"])
    doc["wall_s"] = round(time.time() - t0, 1)
    if args.label:  # a labelled run sits beside the defaults' table, which it does not replace
        keep = ("command", "machine", "synth_s", "wall_s", "date", "table", "domains")
        run = {"segmenters": _versions(tasks), **{k: doc[k] for k in keep}}
        run["command"] += f" --tasks {' '.join(tasks)} --label '{args.label}'" + "".join(f" --set {x}" for x in args.sets)
        if bundles:  # a candidate on other cases: which model ran
            meta = _json(ROOT / next(iter(bundles.values())) / "configs" / "metadata.json") or {}
            run["bundle"] = {"tool_dir": args.candidate, "name": meta.get("name"), "version": meta.get("version")}
            run["command"] += f" --candidate {args.candidate}"
        doc = _json(args.out) or {}
        doc.setdefault("runs", {})[args.label] = run
    elif bundles:  # a candidate sits beside the defaults' table, which it does not replace
        tool, folder = next(iter(bundles.items()))
        meta = _json(ROOT / folder / "configs" / "metadata.json") or {}
        cand = {"tool": tool, "bundle": folder, "name": meta.get("name"), "version": meta.get("version"),
                "description": meta.get("description"), "training": meta.get("training"),
                **{k: doc[k] for k in ("command", "machine", "wall_s", "date", "table", "domains")}}
        cand["command"] += f" --tasks {' '.join(tasks)} --candidate {args.candidate}"
        doc = _json(args.out) or {}
        doc.setdefault("candidates", {})[str(meta.get("name") or folder)] = cand
    else:  # the defaults' table: the candidates and labelled runs already filed stay
        kept = _json(args.out) or {}
        doc.update({"segmenters": _versions(tasks), **{k: kept[k] for k in ("candidates", "runs") if k in kept}})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")
    shown = run if args.label else cand if bundles else doc
    for task, d in shown["domains"].items():
        print(task, json.dumps(d["summary"]), json.dumps(d["low_confidence"]))
    print(f"-> {args.out} ({shown['wall_s']} s)")


if __name__ == "__main__":
    main()
