"""Parallel speed: the nine-task bench on a local Ray cluster vs the same runs one after another.

Both arms get the same cases (synthesised once) and the same plans (the offline planner's,
compiled). The sequential arm is the BCER reference implementation's way: one process,
every tool called directly in topological order, each case after the other, deliverables
written and validated against the contract. The parallel arm is ``bcer bench``'s runner:
one cohort per task, all tasks at once, on a ``--cpus`` local Ray cluster; it runs twice,
cold (fresh workers import the tool modules) and warm (a long-lived cluster). Neither arm
grades its deliverables against the ground truth (``bcer bench`` does, as each case finishes):
both do the work a user's run does, and the parallel arm also bcer's plausibility checks,
events and provenance.

    .venv/bin/python benchmarks/parallel.py --cases 2 --cpus 2 --size small

Writes ``benchmarks/results/parallel.json`` (times, SR per arm, the ratio).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bcer.agents.planners.offline import OfflinePlanner
from bcer.bench.bench import resolve_tasks, run_task_cases
from bcer.bench.cases import synth_task_cases
from bcer.contracts import Case, TaskContract, ToolError, Workflow, load_contract
from bcer.engine.binder import resolve_params, resolved_ref, runtime_values, sequence_key
from bcer.engine.outputs import write_artifact
from bcer.engine.planning import plan_and_compile
from bcer.engine.validate import score, validate_deliverables
from bcer.io import load_sequence
from bcer.tools.registry import call_tool

log = logging.getLogger("bench.parallel")
RESULT = Path(__file__).parent / "results" / "parallel.json"


def _workers_cpu_s() -> float:
    """CPU seconds so far of every process below this one (the local Ray cluster's)."""
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:  # exited between the listing and the read
            pass
    return total


def _value(token: str, case: Case, seqs: dict[str, Any], outputs: dict[str, dict[str, Any]]) -> Any:
    scope, name, *rest = token[1:].split(".")
    if scope == "seq":
        key = sequence_key(case, name)
        if key not in seqs:  # loaded on first use, once per case, like the reference code
            seqs[key] = load_sequence(resolved_ref(case, key))
        return seqs[key]
    return outputs[name][rest[0]]


def run_sequential_case(case: Case, contract: TaskContract, out: Path) -> dict[str, Any]:
    """Plan, then call every tool in this process in topological order; write and validate."""
    t0 = time.time()
    case_dir = out / case.id
    case_dir.mkdir(parents=True, exist_ok=True)
    try:
        _, wf, _ = plan_and_compile(OfflinePlanner(), contract.goal, case, contract)
        milestones = _execute(wf, case, case_dir)
    except ToolError as e:
        return {"case": case.id, "sr": 0, "tcr": 0.0, "error": f"{e.code.value}: {e.message}",
                "duration_s": time.time() - t0}
    checks = validate_deliverables(contract, case_dir, case)
    sr, tcr = score(contract, milestones, checks)
    return {"case": case.id, "sr": sr, "tcr": tcr, "error": None, "duration_s": time.time() - t0}


def _execute(wf: Workflow, case: Case, case_dir: Path) -> list[str]:
    seqs: dict[str, Any] = {}
    outputs: dict[str, dict[str, Any]] = {}
    runtime = runtime_values(case_dir, "cpu", 0, "sequential")
    for node in wf.nodes:  # the compiler emits nodes in topological order
        inputs = {p: _value(tok, case, seqs, outputs) for p, tok in node.inputs.items()}
        params = resolve_params(node.params, case, runtime)
        outputs[node.id] = call_tool(node.tool, inputs, params)
    for d in wf.deliverables:
        write_artifact(outputs[d.node][d.field], case_dir / d.file)
    return [n.milestone for n in wf.nodes if n.milestone]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--cases", type=int, default=2, help="cases per task")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    ap.add_argument("--size", default="small", choices=["small", "full"])
    ap.add_argument("--max-in-flight", type=int, default=2, help="cases in flight per task (parallel arm)")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temp dir, removed)")
    ap.add_argument("--result", type=Path, default=RESULT)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = args.out or Path(tempfile.mkdtemp(prefix="bcer_parallel_"))
    ids = resolve_tasks(args.tasks)
    t0 = time.time()
    cases = {t: synth_task_cases(t, args.cases, work / "data" / t, args.size) for t in ids}
    synth_s = time.time() - t0

    t0, c0 = time.time(), time.process_time()
    seq_rows = {t: [run_sequential_case(c, load_contract(t), work / "sequential" / t) for c in cs]
                for t, cs in cases.items()}
    seq_s = time.time() - t0
    seq_cpu_s = time.process_time() - c0  # all threads of this one process (ITK registers with 2)

    import ray

    t0 = time.time()
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=tempfile.mkdtemp(prefix="bcer_ray_"))
    ray_start_s = time.time() - t0
    t0, c0, w0 = time.time(), time.process_time(), _workers_cpu_s()
    par = run_task_cases(cases, work / "parallel", max_in_flight=args.max_in_flight, quality=False)
    par_s = time.time() - t0
    par_cpu_s = (time.process_time() - c0) + (_workers_cpu_s() - w0)
    # the same runs again on the now warm workers (tool modules imported, models cached): what a
    # long-lived cluster running cohort after cohort sees
    t0, c0, w0 = time.time(), time.process_time(), _workers_cpu_s()
    run_task_cases(cases, work / "parallel_warm", max_in_flight=args.max_in_flight, quality=False)
    warm_s = time.time() - t0
    warm_cpu_s = (time.process_time() - c0) + (_workers_cpu_s() - w0)
    ray.shutdown()

    n = sum(len(cs) for cs in cases.values())
    result = {
        "what": "nine-task bench: local Ray cluster vs the same runs one after another in one process",
        "tasks": ids, "cases_per_task": args.cases, "cases": n, "size": args.size, "cpus": args.cpus,
        "max_in_flight_per_task": args.max_in_flight, "synth_s": round(synth_s, 2),
        "sequential_s": round(seq_s, 2), "parallel_s": round(par_s, 2), "ray_start_s": round(ray_start_s, 2),
        "speedup": round(seq_s / par_s, 3) if par_s else None,
        "speedup_incl_ray_start": round(seq_s / (par_s + ray_start_s), 3),
        "parallel_warm_s": round(warm_s, 2), "speedup_warm": round(seq_s / warm_s, 3) if warm_s else None,
        # CPU seconds of each arm (parallel: driver + every process Ray started) and the speed-up
        # the CPU work alone allows on --cpus cores: seq wall / (parallel CPU / cpus)
        "sequential_cpu_s": round(seq_cpu_s, 1), "parallel_cpu_s": round(par_cpu_s, 1),
        "parallel_warm_cpu_s": round(warm_cpu_s, 1),
        "cpu_bound_speedup": round(seq_s / (par_cpu_s / args.cpus), 3),
        "cpu_bound_speedup_warm": round(seq_s / (warm_cpu_s / args.cpus), 3),
        "load_average_1min": round(os.getloadavg()[0], 2), "uptime": os.popen("uptime").read().strip(),
        "command": "python benchmarks/parallel.py " + " ".join(__import__("sys").argv[1:]),
        "sr_sequential": {t: sum(r["sr"] for r in rows) / len(rows) for t, rows in seq_rows.items()},
        "sr_parallel": {r["task"]: sum(x["sr"] for x in r["rows"]) / len(r["rows"]) for r in par},
        "sequential_errors": [dict(r, task=t) for t, rows in seq_rows.items() for r in rows if r["error"]],
        # the longest case bounds the parallel arm from below (no case is split over processes
        # unless its DAG branches): the critical path next to the 2-core floor
        "sequential_case_s": {t: [round(r["duration_s"], 2) for r in rows] for t, rows in seq_rows.items()},
        "floor_s": round(max(seq_s / args.cpus, max(r["duration_s"] for rows in seq_rows.values() for r in rows)), 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("cases", "sequential_s", "parallel_s", "speedup",
                                             "speedup_incl_ray_start", "parallel_warm_s", "speedup_warm",
                                             "cpu_bound_speedup", "cpu_bound_speedup_warm",
                                             "load_average_1min")}, indent=2))
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
