"""Plausibility on the bench phantoms: SR (delivered) vs SR (plausible) per task, every
check's pass/fail/not-applicable counts and value range, and what the checks cost.

Runs ``bcer bench`` (the offline planner, all nine tasks by default) on phantoms, then re-runs
every contract's plausibility checks over the written deliverables to time them apart from
the engine (they run in the driver when a case finishes); the per-check table is built
from that re-run. A false alarm on these phantoms is a case whose deliverables validated but
failed a check. ``--reuse`` re-checks an existing bench output folder (same deliverables,
current checks) without running the bench again.

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


def recheck(out: Path, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: SR delivered (the bench's validators), SR plausible and per-check counts from
    a fresh run of the checks, and the seconds they take per case (deliverables re-read)."""
    from bcer.bench.bench import plausibility_summary

    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)
    result: dict[str, dict[str, Any]] = {}
    for task, trows in by_task.items():
        contract = load_contract(task)
        cases = {c.id: c for c in _read_cases(out / "data" / task)}
        secs, fresh = [], []
        for r in trows:
            case_dir, case = out / "runs" / task / r["case"], cases.get(r["case"])
            checks: list[dict[str, Any]] = []
            if case is not None and case_dir.is_dir():
                t0 = time.perf_counter()
                checks = [c.to_dict() for c in run_checks(contract, case, case_dir,
                                                           validate_deliverables(contract, case_dir, case))]
                secs.append(time.perf_counter() - t0)
            ok = bool(r["sr_delivered"]) and all(c["ok"] is not False for c in checks)
            fresh.append({"case": r["case"], "sr_delivered": int(r["sr_delivered"]), "sr": int(ok),
                          "plausibility": checks})
        n = len(fresh)
        result[task] = {
            "cases": n, "sr_delivered": round(sum(f["sr_delivered"] for f in fresh) / n, 4),
            "sr_plausible": round(sum(f["sr"] for f in fresh) / n, 4),
            "checks": plausibility_summary(fresh),
            "check_seconds_per_case": {"median_s": round(statistics.median(secs), 4) if secs else None,
                                       "max_s": round(max(secs), 4) if secs else None},
            "false_alarms": [{"case": f["case"], "failed": [c for c in f["plausibility"] if c["ok"] is False]}
                             for f in fresh if f["sr_delivered"] and not f["sr"]]}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--cases", type=int, default=3)
    ap.add_argument("--size", default="small", choices=("small", "full"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="bench output folder (default: a temp dir)")
    ap.add_argument("--reuse", action="store_true", help="re-check the bench output in --out; do not rerun it")
    args = ap.parse_args()
    tasks = resolve_tasks(args.tasks)
    out = args.out or Path(tempfile.mkdtemp(prefix="bcer_plausibility_"))
    before = _load()
    if args.reuse:
        report = json.loads((out / "bench.json").read_text())
    else:
        report = run_bench(tasks, args.cases, out, size=args.size, seed=args.seed)
    rows = [r for r in report["cases"] if r["task"] in tasks]
    result = {
        "command": f"benchmarks/plausibility.py --tasks {args.tasks} --cases {args.cases} --size {args.size} "
                   f"--seed {args.seed}" + (" --reuse" if args.reuse else ""),
        "bench_config": report["config"], "bench_wall_s": report["total_wall_s"],
        "load_before": before, "tasks": recheck(out, rows), "load_after": _load(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"plausibility_{args.size}{args.cases}.json"
    path.write_text(json.dumps(result, indent=2))
    for t, s in result["tasks"].items():
        print(f"{t:18s} SR delivered {100 * s['sr_delivered']:5.1f} %  SR plausible {100 * s['sr_plausible']:5.1f} %"
              f"  checks {s['check_seconds_per_case']['median_s']} s/case")
    print(f"false alarms: {sum(len(s['false_alarms']) for s in result['tasks'].values())}; wrote {path}")


if __name__ == "__main__":
    main()
