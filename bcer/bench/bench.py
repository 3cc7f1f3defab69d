"""``bcer bench``: the task-contract benchmark (SR/TCR) with tool quality beside it.

For each task the cases are synthesised (phantoms with exact truth, written in the real
layout of that kind of study) or read from ``data``; every (task, case) then runs on Ray:
one cohort per task, all tasks at once, so the cluster interleaves cases of every task.
SR and TCR are the executor's contract validation (``bcer.engine.validate.score``), exactly
as defined there; quality metrics (``bcer.bench.quality``) are computed afterwards from the
written deliverables and reported beside them, never folded in.

Output::

    OUT/bench.json          config, per-task summary, per-case rows, total wall time
    OUT/data/<task>/...     the synthesised cases (unless ``data`` was given)
    OUT/runs/<task>/...     each task's cohort output (per-case deliverables, trace, provenance)
"""
from __future__ import annotations

import logging
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from ..contracts import Case, ErrorCode, TaskContract, ToolError, list_contracts, load_contract
from ..tools.io import write_json
from .cases import TASK_DATA, family_options, synth_task_cases
from .quality import case_quality, summarise

log = logging.getLogger(__name__)
BENCH_FILE = "bench.json"


def resolve_tasks(tasks: str | Iterable[str]) -> list[str]:
    """``"all"``, ``"a,b"`` or a list -> contract ids, checked.

    Raises:
        ToolError: ``value_range`` naming an unknown task.
    """
    known = list_contracts()
    if isinstance(tasks, str):
        tasks = known if tasks.strip() == "all" else [t.strip() for t in tasks.split(",") if t.strip()]
    out = list(dict.fromkeys(tasks))
    for t in out:
        if t not in known:
            from ..contracts.errors import did_you_mean

            raise ToolError(ErrorCode.value_range, f"unknown task {t!r}", did_you_mean(t, known), arg="tasks")
    if not out:
        raise ToolError(ErrorCode.value_range, "no task given", f"known: {known}", arg="tasks")
    return out


def _cases_for(task: str, n_cases: int, out: Path, size: str, data: Path | None, seed: int,
               family: str = "base") -> list[Case]:
    if data is None:
        target = out / "data" / task
        if target.exists():  # synthesis is deterministic; layouts would renumber onto old cases
            shutil.rmtree(target)
        return synth_task_cases(task, n_cases, target, size, seed, family)
    root = data / task if (data / task).is_dir() else data
    return _read_cases(root)[:n_cases]


def _read_cases(root: Path) -> list[Case]:
    """Cases of a dataset folder; a folder whose sub-folders are named after layouts (as
    ``bench`` writes its data) is read one layout at a time, by name, not by detection."""
    from ..api import load_cases
    from ..datasets.layouts import layouts

    subs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    known = layouts()
    if subs and all(p.name in known for p in subs):
        return [c for p in subs for c in load_cases(p, p.name)]
    return load_cases(root)


def _run_task(task: str, cases: list[Case], out: Path, address: str | None, seed: int,
              max_in_flight: int, on_case_done: Callable[[dict], None] | None) -> dict[str, Any]:
    from ..actors.brain import OfflineBrain
    from ..engine.cohort import CohortConfig, run_cohort

    contract = load_contract(task)
    cfg = CohortConfig(out=out / "runs" / task, planner=OfflineBrain(), contract=contract,
                       max_in_flight=max_in_flight, address=address, seed=seed)
    t0 = time.time()
    result = run_cohort(cases, cfg, on_case_done=on_case_done)
    by_id = {c.id: c for c in cases}
    rows = []
    for row in result.rows:
        case = by_id.get(row["case"])
        case_dir = cfg.out / row["case"]
        quality = (case_quality(case, case_dir, contract)
                   if case is not None and case.ground_truth and (case_dir / "workflow.json").exists() else {})
        rows.append({"task": task, "case": row["case"], "status": row["status"], "sr": row.get("sr") or 0,
                     "tcr": float(row.get("tcr") or 0.0), "error_code": row.get("error_code"),
                     "error_message": row.get("error_message"), "error_node": row.get("error_node"),
                     "duration_s": row.get("duration_s"), "repairs": row.get("repairs", 0),
                     "plan_revisions": row.get("plan_revisions"), "quality": quality})
    return {"task": task, "rows": rows, "wall_s": round(time.time() - t0, 2), "out": str(cfg.out)}


def run_task_cases(cases: dict[str, list[Case]], out: str | Path, address: str | None = None, seed: int = 0,
                   max_in_flight: int = 2, on_case_done: Callable[[dict], None] | None = None
                   ) -> list[dict[str, Any]]:
    """Run every task's cases on Ray, one cohort per task, all tasks concurrently.

    Returns:
        Per task ``{"task", "rows", "wall_s", "out"}``; each row carries SR/TCR, the error
        and the case's quality metrics. Cohort outputs go to ``OUT/runs/<task>``.
    """
    from ..engine.compiler import resolve_registry

    resolve_registry()  # import every tool module once, before the task threads plan concurrently
    with ThreadPoolExecutor(max_workers=max(1, len(cases)), thread_name_prefix="bcer-bench") as pool:
        futures = [pool.submit(_run_task, t, cs, Path(out), address, seed, max_in_flight, on_case_done)
                   for t, cs in cases.items()]
        return [f.result() for f in futures]


def task_summary(contract: TaskContract, rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Cases, SR, TCR (means over cases), quality means with thresholds, median wall per case."""
    n = len(rows)
    durations = [r["duration_s"] for r in rows if r.get("duration_s") is not None]
    return {
        "task": contract.id, "chain": contract.chain, "cases": n,
        "sr": round(sum(r["sr"] for r in rows) / n, 4) if n else 0.0,
        "tcr": round(sum(r["tcr"] for r in rows) / n, 4) if n else 0.0,
        "quality": summarise(contract, [r["quality"] for r in rows]),
        "median_case_s": round(statistics.median(durations), 2) if durations else None,
        "task_wall_s": wall_s,
        "failures": [{"case": r["case"], "status": r["status"], "error_code": r["error_code"],
                      "error_message": r["error_message"], "node": r["error_node"]} for r in rows if not r["sr"]],
    }


def run_bench(tasks: str | Iterable[str] = "all", n_cases: int = 10, out: str | Path = "bench_out",
              address: str | None = None, size: str = "small", data: str | Path | None = None,
              seed: int = 0, max_in_flight: int = 2,
              on_case_done: Callable[[dict], None] | None = None, family: str = "base") -> dict[str, Any]:
    """Run the benchmark and write ``OUT/bench.json``.

    Args:
        tasks: "all", "id,id" or a list of contract ids.
        n_cases: cases per task.
        out: output folder.
        address: Ray cluster address (None: RAY_ADDRESS or a local cluster).
        size: phantom size, "small" or "full" (ignored with ``data``).
        data: a dataset folder (or one sub-folder per task) read instead of synthesising.
        seed: phantom seed.
        max_in_flight: cases of one task in flight at once (all tasks run concurrently).
        on_case_done: called with each finished cohort row (progress display).
        family: phantom family ("base" | "randomised" | "heldout"; ignored with ``data``);
            every task must offer it (``bcer.bench.cases.supports_family``).

    Returns:
        ``{"config", "tasks": {id: summary}, "cases": [rows], "total_wall_s", "synth_s"}``.
    """
    from ..engine.cluster import ensure_ray

    ids = resolve_tasks(tasks)
    if size not in ("small", "full"):
        raise ToolError(ErrorCode.value_range, f"size must be small or full, got {size!r}", arg="size")
    for t in ids:
        if data is None and t not in TASK_DATA:
            raise ToolError(ErrorCode.value_range, f"task {t!r} has no phantom generator; give --data", arg="tasks")
        if data is None:
            family_options(t, family)  # fail before any synthesis when a task lacks the family
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cases = {t: _cases_for(t, n_cases, out, size, Path(data) if data else None, seed, family) for t in ids}
    synth_s = time.time() - t0
    resources = ensure_ray(address)
    t1 = time.time()
    results = run_task_cases(cases, out, address, seed, max_in_flight, on_case_done)
    run_s = time.time() - t1
    summary = {r["task"]: task_summary(load_contract(r["task"]), r["rows"], r["wall_s"]) for r in results}
    report = {
        "config": {"tasks": ids, "n_cases": n_cases, "size": size if data is None else None,
                   "family": family if data is None else None,
                   "data": str(data) if data else None, "seed": seed, "planner": "offline",
                   "max_in_flight_per_task": max_in_flight, "cluster": resources},
        "tasks": summary, "cases": [row for r in results for row in r["rows"]],
        "synth_s": round(synth_s, 2), "run_s": round(run_s, 2), "total_wall_s": round(time.time() - t0, 2),
    }
    write_json(report, out / BENCH_FILE)
    log.info("bench: %d tasks, %d cases, %.1f s -> %s", len(ids), len(report["cases"]), report["total_wall_s"],
             out / BENCH_FILE)
    return report


__all__ = ["BENCH_FILE", "resolve_tasks", "run_bench", "run_task_cases", "task_summary"]
