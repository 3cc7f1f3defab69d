"""The held-out table: ``bcer bench --family heldout`` over every task whose phantoms offer it.

The held-out phantom family (``family="heldout"``) draws other parameter ranges and anatomy
variants than the domain-randomised family the tools were tuned and trained on; nothing is
tuned on it. This script runs the bench on it (SR/TCR through the engine, on Ray, as
``bcer bench`` does) and writes the quality table the issue asks for: per task SR, TCR and
every quality metric with its mean, min, max and n over cases, beside the goals:

- prostate gland Dice >= 0.85; lesion sensitivity >= 0.9 with <= 0.5 false positives per case;
- registration (ADC -> T2w, mean over the gland per case) <= 1 mm mean and <= 2 mm worst case;
- ED/ES exact >= 95 % (when the cardiac family supports it).

Tasks: ``prostate_report`` and ``register_prostate`` always; any other task whose phantom
generator offers the family (``bcer.bench.cases.supports_family``), unless ``--tasks`` names them.

Usage::

    python benchmarks/heldout.py --cases 10 --size small [--family heldout] [--tasks auto|a,b]
        [--out benchmarks/results/heldout_small10.json] [--work /tmp/heldout]

The JSON records the machine load (``uptime`` before and after), the git commit, the config
and per-case quality, so the numbers can be traced and rerun.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from bcer.bench import run_bench
from bcer.bench.cases import TASK_DATA, supports_family
from bcer.metrics import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
ALWAYS = ("prostate_report", "register_prostate")
# metric -> (goal, "min" | "max" | "mean_max", what the goal constrains)
GOALS: dict[str, tuple[float, str]] = {
    "gland_dice": (0.85, "mean>="),
    "lesion_sensitivity": (0.9, "mean>="),
    "lesion_false_positives": (0.5, "mean<="),
    "registration_error_mm": (1.0, "mean<="),
    "registration_error_mm:max": (2.0, "max<="),
    "ed_es_exact": (0.95, "mean>="),
}


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=False).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "mean": None, "min": None, "max": None}
    v = np.asarray(values, dtype=np.float64)
    return {"n": int(v.size), "mean": round(float(v.mean()), 4), "min": round(float(v.min()), 4),
            "max": round(float(v.max()), 4)}


def _goal(metric: str, stats: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key in (metric, f"{metric}:max"):
        if key not in GOALS or stats["n"] == 0:
            continue
        goal, how = GOALS[key]
        value = stats["max"] if how.startswith("max") else stats["mean"]
        met = value >= goal if how.endswith(">=") else value <= goal
        out.append({"goal": f"{how.replace('<=', ' <= ').replace('>=', ' >= ')}{goal:g}", "value": value, "met": bool(met)})
    return out


def quality_table(report: dict[str, Any]) -> dict[str, Any]:
    """Per task: SR, TCR, failures, and every quality metric's mean/min/max/n and goals."""
    table = {}
    for task, summary in report["tasks"].items():
        rows = [r for r in report["cases"] if r["task"] == task]
        metrics = sorted({k for r in rows for k in (r.get("quality") or {})})
        q = {}
        for m in metrics:
            st = _stats([r["quality"][m] for r in rows if r.get("quality", {}).get(m) is not None])
            q[m] = {**st, "goals": _goal(m, st)}
        table[task] = {"cases": summary["cases"], "sr": summary["sr"], "tcr": summary["tcr"],
                       "median_case_s": summary.get("median_case_s"), "quality": q,
                       "failures": summary.get("failures", [])}
    return table


def pooled_lesions(cases: list[dict[str, Any]], work: Path, task: str = "prostate_report") -> dict[str, Any] | None:
    """Lesion detection pooled over the cohort: true lesions found / true lesions, with its 95 %
    Wilson interval, and false positives per case. The table's ``lesion_sensitivity`` is a mean
    of per-case fractions over the cases that have lesions, which weighs a one-lesion case like
    a three-lesion one; the pooled count is what a reader of "sensitivity" expects. The number
    of true lesions per case is read from the truth the bench wrote (``bcer_truth.json``)."""
    truth = {f.parent.name: json.loads(f.read_text()) for f in (work / "data" / task).glob("*/*/bcer_truth.json")}
    rows = [r for r in cases if r["task"] == task and r["case"] in truth]
    if not rows:
        return None
    n_true = hits = fp = 0
    for r in rows:
        n = len(truth[r["case"]]["values"].get("lesions", []))
        sens = (r.get("quality") or {}).get("lesion_sensitivity")
        n_true += n
        hits += int(round((sens or 0.0) * n))  # an undelivered case finds nothing
        fp += (r.get("quality") or {}).get("lesion_false_positives") or 0
    lo, hi = wilson_interval(hits, n_true)
    return {"cases": len(rows), "true_lesions": n_true, "found": hits,
            "sensitivity": round(hits / n_true, 4) if n_true else None, "sensitivity_95ci": [round(lo, 3), round(hi, 3)],
            "false_positives_per_case": round(fp / len(rows), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10)
    ap.add_argument("--size", default="small", choices=("small", "full"))
    ap.add_argument("--family", default="heldout", choices=("heldout", "randomised", "base"))
    ap.add_argument("--tasks", default="auto", help="auto (every task offering the family) or a,b,...")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-in-flight", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bcer_heldout"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.tasks == "auto":
        tasks = list(ALWAYS) + [t for t in TASK_DATA if t not in ALWAYS and supports_family(t, args.family)]
    else:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    skipped = [t for t in TASK_DATA if t not in tasks]
    out = args.out or ROOT / "benchmarks" / "results" / f"{args.family}_{args.size}{args.cases}.json"
    load_before, t0 = _load(), time.time()
    report = run_bench(tasks, args.cases, args.work, size=args.size, seed=args.seed,
                       max_in_flight=args.max_in_flight, family=args.family)
    doc = {
        "what": f"bcer bench on the {args.family!r} phantom family: SR/TCR and quality against exact truth",
        "rule": "the held-out family is never used to tune or train anything (bcer/datasets/prostate.py)",
        "command": f"python benchmarks/heldout.py --cases {args.cases} --size {args.size} --family {args.family}"
                   + ("" if args.tasks == "auto" else f" --tasks {args.tasks}")
                   + (f" --seed {args.seed}" if args.seed else ""),
        "commit": _commit(), "load_before": load_before, "load_after": _load(),
        "cpus": os.cpu_count(), "wall_s": round(time.time() - t0, 1),
        "config": report["config"], "tasks_without_family": skipped,
        "table": quality_table(report),
        "cases": [{k: r.get(k) for k in ("task", "case", "status", "sr", "tcr", "error_code", "error_message",
                                         "duration_s", "quality")} for r in report["cases"]],
    }
    if "prostate_report" in doc["table"]:
        doc["table"]["prostate_report"]["pooled_lesions"] = pooled_lesions(doc["cases"], args.work)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    for task, t in doc["table"].items():
        print(f"{task}: SR {t['sr']:.2f} TCR {t['tcr']:.2f} ({t['cases']} cases)")
        for m, q in t["quality"].items():
            goals = "; ".join(f"{g['goal']}: {'met' if g['met'] else 'MISSED'}" for g in q["goals"])
            print(f"  {m}: mean {q['mean']} min {q['min']} max {q['max']} (n={q['n']}) {goals}")
        if t.get("pooled_lesions"):
            print(f"  pooled lesions: {t['pooled_lesions']}")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
