"""Plausibility on the bench phantoms: SR (delivered) vs SR (plausible) per task, every
check's pass/fail/not-applicable counts and value range, and what the checks cost.

Runs ``bcer bench`` (the offline Brain, all nine tasks by default) on phantoms, then re-runs
every contract's plausibility checks over the written deliverables to time them apart from
the engine (they run in the driver when a case finishes). A false alarm on these phantoms
is a case whose deliverables validated but failed a check: ``sr_delivered`` > ``sr``.

    PYTHONPATH=. .venv/bin/python benchmarks/plausibility.py --cases 3 --size small

Writes ``benchmarks/results/plausibility_<size><cases>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bcer.bench.bench import _read_cases, resolve_tasks, run_bench
from bcer.contracts import load_contract
from bcer.engine.plausibility import run_checks
from bcer.engine.validate import validate_deliverables

RESULTS = Path(__file__).parent / "results"


def _load() -> dict[str, Any]:
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1_5_15": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": os.cpu_count()}


def time_checks(out: Path, tasks: list[str]) -> dict[str, dict[str, Any]]:
    """Seconds to run each case's plausibility checks (deliverables re-read from disk)."""
    timing: dict[str, dict[str, Any]] = {}
    for task in tasks:
        contract = load_contract(task)
        cases = {c.id: c for c in _read_cases(out / "data" / task)}
        secs = []
        for case_dir in sorted(p for p in (out / "runs" / task).iterdir() if p.is_dir()):
            case = cases.get(case_dir.name)
            if case is None:
                continue
            t0 = time.perf_counter()
            run_checks(contract, case, case_dir, validate_deliverables(contract, case_dir, case))
            secs.append(time.perf_counter() - t0)
        timing[task] = {"cases": len(secs), "median_s": round(statistics.median(secs), 4) if secs else None,
                        "max_s": round(max(secs), 4) if secs else None}
    return timing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--cases", type=int, default=3)
    ap.add_argument("--size", default="small", choices=("small", "full"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="bench output folder (default: a temp dir)")
    args = ap.parse_args()
    tasks = resolve_tasks(args.tasks)
    out = args.out or Path(tempfile.mkdtemp(prefix="bcer_plausibility_"))
    before = _load()
    report = run_bench(tasks, args.cases, out, size=args.size, seed=args.seed)
    timing = time_checks(out, tasks)
    result = {
        "command": f"benchmarks/plausibility.py --tasks {args.tasks} --cases {args.cases} --size {args.size} "
                   f"--seed {args.seed}",
        "load_before": before, "load_after": _load(), "bench_wall_s": report["total_wall_s"],
        "tasks": {t: {"cases": s["cases"], "sr_delivered": s["sr_delivered"], "sr_plausible": s["sr"],
                      "implausible": s["implausible"], "checks": s["plausibility"],
                      "check_seconds_per_case": timing[t],
                      "failures": s["failures"]} for t, s in report["tasks"].items()},
        "false_alarms": [{"task": r["task"], "case": r["case"], "failed": [p for p in r["plausibility"]
                                                                           if p["ok"] is False]}
                         for r in report["cases"] if r["sr_delivered"] and not r["sr"]],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"plausibility_{args.size}{args.cases}.json"
    path.write_text(json.dumps(result, indent=2))
    for t, s in result["tasks"].items():
        print(f"{t:18s} SR delivered {100 * s['sr_delivered']:5.1f} %  SR plausible {100 * s['sr_plausible']:5.1f} %"
              f"  checks {s['check_seconds_per_case']['median_s']} s/case")
    print(f"false alarms: {len(result['false_alarms'])}; wrote {path}")


if __name__ == "__main__":
    main()
