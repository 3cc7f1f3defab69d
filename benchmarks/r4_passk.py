"""R4 pass@k: k = 1 vs k = 3 drafts per report (best of k by Reflector penalty), issues per
report of the chosen draft and after repair, on a stream of bench cases of the three report
tasks. The drafter comes from ``--llm`` (an LLM backend spec; ``none`` = the template drafter).

With the template drafter there is nothing to choose between: its draft has no issue and
k = 3 gives the same single draft (the loop deduplicates), so the curve is flat at 0 by
construction. The measurement is meant for an LLM drafter (``--llm local``: the local CPU
model of the llm workstream), whose k samples differ.

    python benchmarks/r4_passk.py --llm local --cases 10 --out benchmarks/results/r4_passk.json
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from _r4_stream import make_drafter, run_case, stream


NOTE_PK = 'template drafter: one draft with no issue whatever k (the loop deduplicates identical drafts), so pass@1 = pass@3 = 1 by construction. Rerun with --llm local to compare k = 1 and k = 3.'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llm", default="none", help="LLM backend spec for the drafter (none: template drafter)")
    ap.add_argument("--cases", type=int, default=10, help="cases per report task")
    ap.add_argument("--ks", default="1,3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/r4_passk.json")
    args = ap.parse_args()
    drafter, name = make_drafter(args.llm)
    items, t0 = stream(args.cases, args.seed), time.time()
    res = {"config": {"drafter": name, "cases_per_task": args.cases, "seed": args.seed, "ks": args.ks,
                      "load_avg": os.getloadavg(), "cpus": os.cpu_count()}, "by_k": {}}
    for k in [int(x) for x in args.ks.split(",")]:
        rows = [run_case(it, drafter, k)[1] for it in items]
        res["by_k"][str(k)] = {
            "reports": len(rows), "pass_at_k": round(float(np.mean([r["any_draft_clean"] for r in rows])), 4),
            "issues_per_report_chosen": round(float(np.mean([r["chosen_issues"] for r in rows])), 4),
            "penalty_per_report_chosen": round(float(np.mean([r["chosen_penalty"] for r in rows])), 4),
            "issues_per_report_final": round(float(np.mean([r["final_issues"] for r in rows])), 4),
            "mean_drafts": round(float(np.mean([r["drafts"] for r in rows])), 3),
            "mean_s_per_report": round(float(np.mean([r["s"] for r in rows])), 3), "rows": rows}
        if any("llm_valid" in r for r in rows):  # LLM drafter: pass@k over the drafts the model itself wrote
            res["by_k"][str(k)].update(
                llm_pass_at_k=round(float(np.mean([r["any_llm_draft_clean"] for r in rows])), 4),
                llm_fallback_rate=round(float(np.mean([r["llm_fallback"] for r in rows])), 4),
                llm_valid_per_report=round(float(np.mean([r["llm_valid"] for r in rows])), 3),
                llm_issues_per_valid_draft=round(float(np.mean([p for r in rows for p in r["llm_draft_penalties"]]))
                                                 if any(r["llm_draft_penalties"] for r in rows) else -1, 3))
        print(k, {x: v for x, v in res["by_k"][str(k)].items() if x != "rows"}, flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    if name == "template":
        res["note"] = NOTE_PK
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
