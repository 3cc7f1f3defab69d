"""``bcer bench``: the task-contract benchmark (SR/TCR) with tool quality beside it.

For each task the cases are synthesised (phantoms with exact truth, written in the real
layout of that kind of study) or read from ``data``; every (task, case) then runs on Ray:
one cohort per task, all tasks at once, so the cluster interleaves cases of every task.
SR and TCR are the executor's contract validation (``bcer.engine.validate.score``), exactly
as defined there, with SR also requiring every plausibility check of the contract to pass
(``bcer.engine.plausibility``); ``sr_delivered`` is the validators alone, reported beside
it so a tool that delivers wrong-but-well-formed files shows up as the gap between the two.
Quality metrics (``bcer.bench.quality``) are computed afterwards from the
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
from pathlib import Path
from typing import Any, Callable, Iterable

from ..contracts import Case, ErrorCode, TaskContract, ToolError, list_contracts, load_contract
from ..engine.rows import CaseRow
from ..io import write_json
from .cases import TASK_DATA, family_options, synth_task_cases
from .quality import case_quality, summarise

log = logging.getLogger(__name__)
BENCH_FILE = "bench.json"


def resolve_tasks(tasks: str | Iterable[str]) -> list[str]:
    """``"all"``, ``"a,b"`` or a list -> contract ids, checked.

    Raises:
        ToolError: ``value_range`` naming an unknown task.
    """
    from ..contracts.errors import parse_choices

    return parse_choices(tasks, list_contracts(), "task", "tasks")


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


def _quality(case: Case | None, case_dir: Path, contract: TaskContract) -> dict[str, Any]:
    """The case's quality against its ground truth ({} without truth or without a finished run)."""
    if case is None or not case.ground_truth or not (case_dir / "workflow.json").exists():
        return {}
    return case_quality(case, case_dir, contract)


def _task_rows(task: str, cases: list[Case], result: Any, contract: TaskContract,
               scored: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Bench rows of one task's cohort; ``scored`` holds quality already computed (case id ->),
    ``None`` scores nothing (the row's ``quality`` is then ``{}``)."""
    by_id = {c.id: c for c in cases}
    rows = []
    for r in map(CaseRow.from_dict, result.rows):  # the engine's one row shape (engine.rows)
        quality = ({} if scored is None else scored[r.case] if r.case in scored
                   else _quality(by_id.get(r.case), result.out / r.case, contract))
        rows.append({"task": task, "case": r.case, "status": r.status, "sr": r.sr, "sr_delivered": r.delivered,
                     "tcr": float(r.tcr), "error_code": r.error_code, "error_message": r.error_message,
                     "error_node": r.error_node, "duration_s": r.duration_s, "repairs": r.repairs,
                     "plan_revisions": r.plan_revisions, "quality": quality, "plausibility": r.plausibility})
    return rows


def run_task_cases(cases: dict[str, list[Case]], out: str | Path, address: str | None = None, seed: int = 0,
                   max_in_flight: int = 2, on_case_done: Callable[[dict], None] | None = None,
                   cache: str | Path | None = None, node_timeout_s: float | None = None,
                   bundles: dict[str, str] | None = None, read_roots: tuple[str, ...] = (),
                   controller: Any = None, quality: bool = True,
                   params: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Run every task's cases on Ray, one cohort per task, all tasks from one driver loop.

    Each case is scored against its ground truth as soon as it finishes, while the others still
    run (``quality=False`` scores nothing: a speed benchmark whose reference arm does not score).

    Returns:
        Per task ``{"task", "rows", "wall_s", "out"}``; each row carries SR/TCR, the error
        and the case's quality metrics. Cohort outputs go to ``OUT/runs/<task>``.
    """
    from ..agents.planners.offline import OfflinePlanner
    from ..agents.planners.bundles import BundleBinder
    from ..api import make_repairer, report_reviewer
    from ..engine.cohort import CohortConfig, run_cohorts

    contracts = {t: load_contract(t) for t in cases}
    cfgs: dict[str, CohortConfig] = {}
    for t in cases:
        planner = controller.new_planner() if controller is not None else OfflinePlanner()  # llm: --planner
        if bundles:
            planner = BundleBinder(planner, bundles)
        if params:  # --set: checked by parse_sets / check_params before anything ran
            from ..overrides import ParamSetter

            planner = ParamSetter(planner, params)
        cfgs[t] = CohortConfig(out=Path(out) / "runs" / t, planner=planner, contract=contracts[t],
                               max_in_flight=max_in_flight, address=address, seed=seed, model_dirs=read_roots,
                               cache=Path(cache) if cache else None, node_timeout_s=node_timeout_s,
                               reviewer=report_reviewer(contracts[t]),  # report tasks run the R4 loop (no memory)
                               audit=True)  # the scorer reads each case's workflow.json
    tiers = controller.tiers if controller is not None else None
    for cfg in cfgs.values():  # one pool per task cohort: case ids repeat across tasks, budgets must not
        cfg.repairer = make_repairer(cfg.run_id, tiers)
    finished: dict[str, float] = {}
    scored: dict[str, dict[str, dict[str, Any]]] = {t: {} for t in cases}
    by_id = {t: {c.id: c for c in cs} for t, cs in cases.items()}
    t0 = time.time()

    def done(row: dict[str, Any]) -> None:
        task = row.get("task") or ""
        finished[task] = time.time() - t0
        if quality and task in cfgs:
            try:
                scored[task][row["case"]] = _quality(by_id[task].get(row["case"]), cfgs[task].out / row["case"],
                                                     contracts[task])
            except Exception:  # never inside the driver loop: scored again (and raised) after the run
                log.warning("scoring %s/%s failed; retried after the run", task, row["case"], exc_info=True)
        if on_case_done:
            on_case_done(row)

    try:
        results = run_cohorts([(cases[t], cfgs[t]) for t in cases], on_case_done=done)
    finally:
        for cfg in cfgs.values():
            cfg.repairer.close()
    return [{"task": t, "rows": _task_rows(t, cases[t], r, contracts[t], scored[t] if quality else None),
             "wall_s": round(finished.get(t, time.time() - t0), 2), "out": str(r.out)}
            for t, r in zip(cases, results)]


def plausibility_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per check: cases it ran on, passed, failed, not applicable, and the range of its values."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        for c in r.get("plausibility") or []:
            s = out.setdefault(c["check"], {"deliverable": c["deliverable"], "limit": c.get("limit", ""),
                                            "passed": 0, "failed": 0, "not_applicable": 0, "values": []})
            s[{True: "passed", False: "failed", None: "not_applicable"}[c["ok"]]] += 1
            if c.get("value") is not None:
                s["values"].append(float(c["value"]))
            if c["ok"] is not None and c.get("limit"):
                s["limit"] = c["limit"]
    for s in out.values():
        vals = s.pop("values")
        s["min"], s["max"] = (round(min(vals), 4), round(max(vals), 4)) if vals else (None, None)
    return out


def task_summary(contract: TaskContract, rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Cases, SR (delivered AND plausible), SR delivered (contract validators only), TCR (means
    over cases), plausibility per check, quality means with thresholds, median wall per case."""
    n = len(rows)
    durations = [r["duration_s"] for r in rows if r.get("duration_s") is not None]
    return {
        "task": contract.id, "chain": contract.chain, "cases": n,
        "sr": round(sum(r["sr"] for r in rows) / n, 4) if n else 0.0,
        "sr_delivered": round(sum(r.get("sr_delivered", r["sr"]) for r in rows) / n, 4) if n else 0.0,
        "implausible": sum(r["status"] == "implausible" for r in rows),
        "plausibility": plausibility_summary(rows),
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
              on_case_done: Callable[[dict], None] | None = None, cache: str | Path | None = None,
              node_timeout_s: float | None = None,
              bundles: dict[str, str] | None = None, model_dirs: Iterable[str] = (), planner: str = "offline",
              llm: Any = None, llm_record: str | Path | None = None, reflector: str = "tier1",
              family: str = "base", params: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
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
        cache: node cache folder (reruns reuse every unchanged node).
        node_timeout_s: time limit of every node (default: each tool's own).
        bundles: ``{tool: bundle folder}`` the planner binds as ``bundle_dir`` (relative
            folders are looked up under ``model_dirs``).
        model_dirs: read-only folders of local model bundles.
        planner, llm, llm_record, reflector: as for ``bcer.Study`` (``--planner``, ``--llm``,
            ``--llm-record``, ``--reflector``); one backend serves every task.
        family: phantom family ("base" | "randomised" | "heldout"; ignored with ``data``);
            every task must offer it (``bcer.bench.cases.supports_family``).
        params: ``{tool: {param: value}}`` set on every step of that tool (``--set``).

    Returns:
        ``{"config", "tasks": {id: summary}, "cases": [rows], "total_wall_s", "synth_s"}``.
    """
    from ..agents.planners.bundles import bundle_read_roots, resolve_bundles
    from ..agents.specs import Controller, check_planner, check_reflector
    from ..engine.cluster import ensure_ray

    ids = resolve_tasks(tasks)
    model_dirs = [str(d) for d in model_dirs]
    bundles = resolve_bundles(bundles, model_dirs)
    check_planner(planner), check_reflector(reflector)  # before minutes of synthesis
    if params:
        from ..overrides import check_params

        params = check_params(params)
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
    with Controller(planner, llm=llm, reflector_spec=reflector, llm_record=llm_record, address=address) as ctl:
        results = run_task_cases(cases, out, address, seed, max_in_flight, on_case_done, cache, node_timeout_s,
                                 bundles, bundle_read_roots(bundles, model_dirs), ctl, params=params)
    run_s = time.time() - t1
    summary = {r["task"]: task_summary(load_contract(r["task"]), r["rows"], r["wall_s"]) for r in results}
    report = {
        "config": {"tasks": ids, "n_cases": n_cases, "size": size if data is None else None,
                   "family": family if data is None else None,
                   "data": str(data) if data else None, "seed": seed, "planner": planner, "reflector": reflector,
                   "llm": llm if isinstance(llm, str) or llm is None else getattr(llm, "name", "object"),
                   "max_in_flight_per_task": max_in_flight, "cluster": resources, "bundles": bundles,
                   "cache": str(cache) if cache else None, "params": params or {}},
        "tasks": summary, "cases": [row for r in results for row in r["rows"]],
        "synth_s": round(synth_s, 2), "run_s": round(run_s, 2), "total_wall_s": round(time.time() - t0, 2),
    }
    write_json(report, out / BENCH_FILE)
    log.info("bench: %d tasks, %d cases, %.1f s -> %s", len(ids), len(report["cases"]), report["total_wall_s"],
             out / BENCH_FILE)
    return report


__all__ = ["BENCH_FILE", "plausibility_summary", "resolve_tasks", "run_bench", "run_task_cases", "task_summary"]
