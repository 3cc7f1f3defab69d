"""R4 Reflector and Repairer on an injected-error corpus built from bench cases of the three
report tasks (``bcer.bench.report_errors``): per error type, Reflector recall and precision,
repair success, lesion box IoU before/after repair, residual error rate of final reports.

Every corrupted report carries exactly one injected error with its true location and value.
Recall: injected errors with a matching issue (same type, same sentence, or same entity for
missing facts and boxes). Precision: issues matching an injected error / all issues of that
type raised on corrupted reports (clean reports are reflected too: any issue there is a false
positive). Repair: the bounded loop (<= 2 reflect->repair passes) on the corrupted draft;
success = no material issue left AND the report restored to the clean one (same sentences,
evidence boxes), a ground truth that does not ask the Reflector.

    python benchmarks/r4_errors.py --cases 12 --out benchmarks/results/r4_errors.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcer.agents.r4 import ISSUE_TYPES, R4Config, R4Loop, reflect  # noqa: E402
from bcer.bench.report_errors import TYPES, corrupt, matches, paraphrase  # noqa: E402
from bcer.bench.report_inputs import REPORT_TASKS, report_inputs  # noqa: E402
from bcer.metrics import box_iou  # noqa: E402
from bcer.tools.report import build_evidence, realise  # noqa: E402


class _Given:
    """A drafter that hands the loop the corrupted draft (so the loop reflects and repairs it)."""

    name = "given"

    def __init__(self, draft):
        self.draft = draft

    def drafts(self, ev, route, exemplars, decimals=1):
        return [self.draft], []


def _restored(final, clean, ev) -> bool:
    same_text = sorted(final.findings) == sorted(clean.findings) and sorted(final.impression) == sorted(clean.impression)
    boxes = {b.lesion: b.box_voxel for b in final.boxes}
    return same_text and boxes == {e.id: e.box_voxel for e in ev.lesions() if e.box_voxel}


def run(n_cases: int, seed: int, wording: str = "template") -> dict:
    rng = np.random.default_rng(seed)
    per = {t: {"injected": 0, "detected": 0, "issues": 0, "matched_issues": 0, "repaired": 0, "restored": 0,
               "residual_reflector": 0, "variants": {}} for t in TYPES}
    clean_fp = {t: 0 for t in ISSUE_TYPES}
    box_before, box_after, reports, t0 = [], [], 0, time.time()
    by_task = {}
    for task in REPORT_TASKS:
        n_task = 0
        for i in range(n_cases):
            inputs, info = report_inputs(task, i, seed)
            ev = build_evidence(**inputs)
            clean = realise(ev) if wording == "template" else paraphrase(realise(ev))
            for issue in reflect(clean, ev):
                clean_fp[issue.type] += 1
            for type_ in TYPES:
                for bad, inj in corrupt(clean, ev, type_, rng):
                    reports += 1
                    n_task += 1
                    p = per[type_]
                    p["injected"] += 1
                    v = p["variants"].setdefault(inj.variant, {"injected": 0, "detected": 0, "restored": 0})
                    v["injected"] += 1
                    issues = reflect(bad, ev)
                    hit = any(matches(x, inj) for x in issues)
                    p["detected"] += hit
                    v["detected"] += hit
                    for x in issues:  # precision of every type over the whole corpus
                        per.setdefault(x.type, per[x.type])["issues"] += 1
                        per[x.type]["matched_issues"] += matches(x, inj)
                    out = R4Loop(_Given(bad), config=R4Config(k=1, max_passes=2)).run(ev, task=task)
                    clean_end = not any(x.material for x in out.final_issues)
                    restored = clean_end and _restored(out.draft, clean, ev)
                    p["repaired"] += clean_end
                    p["restored"] += restored
                    v["restored"] += restored
                    p["residual_reflector"] += not clean_end
                    if inj.variant == "box":
                        truth = ev.entities[inj.entity].box_voxel
                        box_before.append(box_iou(inj.injected_value, truth))
                        final_box = next((b.box_voxel for b in out.draft.boxes if b.lesion == inj.entity), None)
                        box_after.append(box_iou(final_box, truth) if final_box else 0.0)
        by_task[task] = {"cases": n_cases, "corrupted_reports": n_task}
    rows = {}
    for t, p in per.items():
        rows[t] = {"injected": p["injected"], "recall": round(p["detected"] / p["injected"], 4) if p["injected"] else None,
                   "precision": round(p["matched_issues"] / p["issues"], 4) if p["issues"] else None,
                   "issues_raised": p["issues"], "repair_success": round(p["restored"] / p["injected"], 4) if p["injected"] else None,
                   "no_issue_after_repair": round(p["repaired"] / p["injected"], 4) if p["injected"] else None,
                   "variants": p["variants"]}
    n = sum(p["injected"] for p in per.values())
    residual = sum(p["injected"] - p["restored"] for p in per.values())
    return {"per_type": rows, "clean_reports_false_positives": clean_fp, "corrupted_reports": reports,
            "tasks": by_task,
            "box_iou": {"n": len(box_before), "before_mean": round(float(np.mean(box_before)), 4) if box_before else None,
                        "after_mean": round(float(np.mean(box_after)), 4) if box_after else None},
            "residual_error_rate": round(residual / n, 4) if n else None,
            "residual_error_rate_reflector": round(sum(p["residual_reflector"] for p in per.values()) / n, 4) if n else None,
            "wall_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=12, help="bench cases per report task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/r4_errors.json")
    args = ap.parse_args()
    res = {w: run(args.cases, args.seed, w) for w in ("template", "paraphrased")}
    res["config"] = {"cases_per_task": args.cases, "seed": args.seed, "drafter": "template (clean) + one injected error",
                     "wordings": "template: the drafter's own sentences; paraphrased: the same after the fixed "
                                 "rewordings of bcer.bench.report_errors.PARAPHRASES (restored = same sentences as "
                                 "the clean paraphrased draft, which a repair that restates a template sentence misses)",
                     "max_passes": 2, "machine": platform.machine(), "cpus": os.cpu_count(),
                     "load_avg": os.getloadavg(), "python": platform.python_version()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    for w in ("template", "paraphrased"):
        print(w)
        for t, r in res[w]["per_type"].items():
            print(f"  {t:14s} n={r['injected']:4d} recall={r['recall']} precision={r['precision']} "
                  f"repair={r['repair_success']} no_issue_after={r['no_issue_after_repair']}")
        print("  box IoU", res[w]["box_iou"], "residual", res[w]["residual_error_rate"],
              "reflector residual", res[w]["residual_error_rate_reflector"], "clean FP", res[w]["clean_reports_false_positives"])


if __name__ == "__main__":
    main()
