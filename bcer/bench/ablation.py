"""The controller ablation: arms x fault types x tasks, with SR, TCR, ERR, safe-halt and
wrong-deliverable rates (``bcer bench --arms ... --faults ...``).

For every task the phantom cases are synthesised once; the planner's clean sketch of each
case fixes the fault targets (:mod:`bcer.bench.faults`); then every arm runs every case once
clean and once per fault type. Per run the row records status, SR/TCR (the contract
validators), the error code, which deliverable files are present and which validated
deliverables differ from the same arm's clean run (:mod:`bcer.bench.compare`). Metrics per
(arm, task, fault) cell (:func:`cell_metrics`):

- **SR**, **TCR**: means over the cell's cases;
- **ERR** (recoverable faults): recovered / injected, where *recovered* = SR 1 and no wrong
  deliverable;
- **safe-halt rate** (unrecoverable faults): runs that ended without success, with the fault's
  typed error code (``input_missing`` / ``sandbox``) and no deliverable file in the case
  folder, over injected;
- **wrong-deliverable rate**: runs with at least one deliverable that passed its validators
  but differs from the clean run, over injected; a difference whose lineage shows the same
  tools on the same input data with other params (an LLM's revised plan) is counted apart as
  ``plan_differs`` (``compare.plan_only_difference``), not as wrong.

A case whose clean run failed in an arm is left out of that arm's cells (``excluded``); a
fault with no target in a case is ``not_applicable`` there, with the reason.

Output::

    OUT/ablation.json        config, arm and fault descriptions, cells, summaries, rows
    OUT/data/<task>/...      synthesised cases;  OUT/faulty/...  corrupted case copies
    OUT/runs/<arm>/<task>/<clean|fault>/<case>/   each run's deliverables and trace
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ..contracts import Case, TaskContract, load_contract
from ..contracts.errors import ErrorCode, ToolError
from ..io import write_json
from . import faults as F
from . import hangs as H
from .arms import ARM_DOCS, resolve_arms, run_engine, run_react
from .compare import lineage, plan_only_difference, present_deliverables, wrong_deliverables
from .react import ArmOutcome, Memo

log = logging.getLogger(__name__)
ABLATION_FILE = "ablation.json"
CLEAN = "clean"


@dataclass
class Job:
    """One (task, case, fault) to run in every arm."""

    task: str
    case: Case                  # the clean case
    fault: str                  # a fault type or "clean"
    run_case: Case              # what the arms read (a corrupted copy for data faults)
    record: F.Fault | None = None
    not_applicable: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.task, self.case.id, self.fault


# ---- scoring (pure) ---------------------------------------------------------------------------------
def score_row(row: dict[str, Any]) -> dict[str, Any]:
    """Add ``recovered``/``safe_halt``/``wrong`` flags to one run row (fault rows only)."""
    if row["fault"] == CLEAN:
        return row
    cls = F.CATALOGUE[row["fault"]]
    wrong = bool(row.get("wrong_deliverables"))
    row["is_wrong"] = wrong
    row["recovered"] = bool(cls.recoverable and row["sr"] == 1 and not wrong)
    row["safe_halt"] = bool(not cls.recoverable and row["status"] != "succeeded"
                            and row.get("error_code") in cls.halt_codes and not row.get("present"))
    return row


def cell_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of one (arm, task, fault) cell (or any group of fault rows of one fault class).

    Rows not applicable or whose clean run failed are counted apart and left out of the rates.
    """
    counted = [r for r in rows if not r.get("not_applicable") and r.get("clean_ok", True)]
    out: dict[str, Any] = {"n": len(counted), "not_applicable": sum(bool(r.get("not_applicable")) for r in rows),
                           "excluded": sum(not r.get("clean_ok", True) and not r.get("not_applicable") for r in rows)}
    if not counted:
        return out
    n = len(counted)
    recoverable = F.CATALOGUE[counted[0]["fault"]].recoverable if counted[0]["fault"] != CLEAN else None
    out["sr"] = round(sum(r["sr"] for r in counted) / n, 4)
    out["tcr"] = round(sum(r["tcr"] for r in counted) / n, 4)
    if recoverable is not None:
        out["wrong_rate"] = round(sum(bool(r.get("is_wrong")) for r in counted) / n, 4)
        if recoverable:
            out["err"] = round(sum(bool(r.get("recovered")) for r in counted) / n, 4)
        else:
            out["safe_halt"] = round(sum(bool(r.get("safe_halt")) for r in counted) / n, 4)
    out["status"] = _counts(r["status"] for r in counted)
    out["error_codes"] = _counts(r.get("error_code") or "-" for r in counted)
    return out


def _counts(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def summarise(rows: list[dict[str, Any]], arms: list[str], tasks: list[str], faults: list[str]) -> dict[str, Any]:
    """Cells per (arm, task, fault), per (arm, fault) over tasks, and per arm over fault classes."""
    def pick(**kw: str) -> list[dict[str, Any]]:
        return [r for r in rows if all(r[k] == v for k, v in kw.items())]

    cells = [{"arm": a, "task": t, "fault": f, **cell_metrics(pick(arm=a, task=t, fault=f))}
             for a in arms for t in tasks for f in [CLEAN, *faults]]
    by_fault = [{"arm": a, "fault": f, **cell_metrics(pick(arm=a, fault=f))} for a in arms for f in [CLEAN, *faults]]
    by_arm = {}
    for a in arms:
        rec = [r for r in rows if r["arm"] == a and r["fault"] != CLEAN and F.CATALOGUE[r["fault"]].recoverable]
        unrec = [r for r in rows if r["arm"] == a and r["fault"] != CLEAN and not F.CATALOGUE[r["fault"]].recoverable]
        ok = [r for r in rec + unrec if not r.get("not_applicable") and r.get("clean_ok", True)]
        rec_ok = [r for r in rec if r in ok]
        unrec_ok = [r for r in unrec if r in ok]
        by_arm[a] = {
            "recoverable_injected": len(rec_ok),
            "err": round(sum(r["recovered"] for r in rec_ok) / len(rec_ok), 4) if rec_ok else None,
            "unrecoverable_injected": len(unrec_ok),
            "safe_halt": round(sum(r["safe_halt"] for r in unrec_ok) / len(unrec_ok), 4) if unrec_ok else None,
            "wrong_deliverables": sum(bool(r.get("is_wrong")) for r in ok),
            # differs from the clean run only because the planner chose other params (not wrong)
            "plan_differs": sum(bool(r.get("plan_differs")) for r in ok),
            "wrong_rate": round(sum(bool(r.get("is_wrong")) for r in ok) / len(ok), 4) if ok else None,
            "clean_sr": cell_metrics(pick(arm=a, fault=CLEAN)).get("sr"),
        }
    return {"cells": cells, "by_arm_fault": by_fault, "by_arm": by_arm}


# ---- preparing the jobs -----------------------------------------------------------------------------
def prepare_jobs(task: str, cases: list[Case], contract: TaskContract, faults: list[str], planner: Any,
                 out: Path, seed: int) -> list[Job]:
    """Clean and faulty jobs of one task: fault targets come from the planner's clean sketch."""
    jobs: list[Job] = []
    for i, case in enumerate(cases):
        jobs.append(Job(task, case, CLEAN, case))
        try:
            sketch = planner.plan(contract.goal, case, contract)
        except Exception as e:  # the clean run will show it; nothing to inject into
            for f in faults:
                jobs.append(Job(task, case, f, case, not_applicable=f"the clean plan failed: {e}"))
            continue
        consumed = F.consumed_sequences(sketch, case)
        donor = cases[i + 1:] + cases[:i]  # the next case first
        for f in faults:
            cls = F.CATALOGUE[f]
            job = Job(task, case, f, case)
            try:
                if cls.layer == F.PLAN:
                    job.record = F.draw_plan_fault(f, sketch, case, contract, seed)
                elif cls.layer == F.DATA:
                    job.run_case, job.record = F.corrupt_case(f, case, contract, consumed,
                                                              out / "faulty" / task / f / case.id, seed, donor)
                else:
                    step = F.fault_rng(f, case.id, seed).choice([s.id for s in sketch.steps])
                    job.record = F.Fault(f, seed, F.RUNTIME, True, step=step,
                                         detail=f"{step}: the first call of its tool hangs")
            except F.NotApplicable as e:
                job.not_applicable = str(e)
            jobs.append(job)
    return jobs


def _planner_for(job: Job, planner: Any, seed: int) -> Any:
    if job.fault != CLEAN and F.CATALOGUE[job.fault].layer == F.PLAN:
        return F.FaultyPlanner(planner, job.fault, seed, rng_key=job.case.id)
    return planner


def _events(job: Job) -> list[dict[str, Any]]:
    if job.record is None:
        return []
    return [{"kind": "fault_injected", "message": job.record.detail, "data": F.fault_event_data(job.record)}]


# ---- running ------------------------------------------------------------------------------------------
class Runner:
    """Runs jobs in every arm and turns outcomes into rows (thread-safe row list)."""

    def __init__(self, out: Path, arms: list[str], planner: Any, seed: int, timeout_s: float,
                 switch: H.HangSwitch, on_row: Callable[[dict], None] | None = None):
        self.out, self.arms, self.planner, self.seed, self.timeout_s = out, arms, planner, seed, timeout_s
        self.switch, self.on_row = switch, on_row
        self.rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def run_dir(self, arm: str, job: Job) -> Path:
        return self.out / "runs" / arm / job.task / job.fault / job.case.id

    def _run_case(self, arm: str, job: Job) -> Case:
        return job.run_case.model_copy(update={"id": f"{job.case.id}.{arm}.{job.fault}"})

    def run(self, arm: str, job: Job, contract: TaskContract, memo: Memo | None = None) -> dict[str, Any]:
        if job.not_applicable:
            return self._add(self._row(arm, job, None, Path(".")))
        case = self._run_case(arm, job)
        out = self.run_dir(arm, job)
        if out.exists():
            import shutil

            shutil.rmtree(out)
        if job.fault == "timeout" and job.record is not None:
            self.switch.arm(case.id, job.record.step or "")
        planner = _planner_for(job, self.planner, self.seed)
        run_id = f"ablation-{arm}"
        try:
            if arm == "bcer":
                outcome = run_engine(case, contract, planner, out, run_id=run_id, node_timeout_s=self.timeout_s,
                                     seed=self.seed, events=_events(job))
            else:
                outcome = run_react(arm, case, contract, planner, out, run_id=run_id, call_timeout_s=self.timeout_s,
                                    memo=memo, hang_file=str(self.switch.file), events=_events(job))
        except Exception as e:  # a crashing arm is a failed row, never a crashed benchmark
            log.exception("%s crashed on %s", arm, job.key)
            outcome = ArmOutcome("failed", {"code": "internal", "message": f"{type(e).__name__}: {e}"})
        return self._add(self._row(arm, job, outcome, out))

    def _row(self, arm: str, job: Job, o: ArmOutcome | None, out: Path) -> dict[str, Any]:
        row: dict[str, Any] = {"arm": arm, "task": job.task, "case": job.case.id, "fault": job.fault}
        if job.fault != CLEAN:
            cls = F.CATALOGUE[job.fault]
            row.update(layer=cls.layer, recoverable=cls.recoverable,
                       fault_detail=job.record.detail if job.record else None)
        if o is None:
            row.update(not_applicable=job.not_applicable, status="n/a", sr=0, tcr=0.0)
            return row
        err = o.error or {}
        row.update(status=o.status, sr=o.sr, tcr=round(o.tcr, 4), error_code=err.get("code"),
                   error_message=(err.get("message") or "")[:300],
                   error_node=err.get("node") or (err.get("context") or {}).get("node"),
                   repairs=o.repairs, revisions=o.revisions, retries=o.retries, duration_s=o.duration_s,
                   present=present_deliverables(load_contract(job.task), out), out=str(out.relative_to(self.out)))
        return row

    def _add(self, row: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.rows.append(row)
        if self.on_row:
            self.on_row(row)
        return row


def compare_rows(rows: list[dict[str, Any]], jobs: dict[tuple[str, str, str], Job], out: Path) -> None:
    """Mark clean runs that failed and each fault row's wrong deliverables (against its clean run)."""
    clean = {(r["arm"], r["task"], r["case"]): r for r in rows if r["fault"] == CLEAN}
    for r in rows:
        c = clean.get((r["arm"], r["task"], r["case"]))
        r["clean_ok"] = bool(c and c["sr"] == 1)
        if r["fault"] == CLEAN or r.get("not_applicable"):
            continue
        job = jobs[(r["task"], r["case"], r["fault"])]
        if c is not None and r["clean_ok"]:
            differ = wrong_deliverables(load_contract(r["task"]), job.run_case, out / r["out"], out / c["out"],
                                        clean_case=job.case)
            plan = {d: why for d in differ
                    if (why := plan_only_difference(lineage(out / r["out"], d), lineage(out / c["out"], d)))}
            r["wrong_deliverables"] = {d: why for d, why in differ.items() if d not in plan}
            if plan:
                r["plan_differs"] = plan
        score_row(r)


def run_ablation(tasks: str | Iterable[str] = "all", arms: str | Iterable[str] = "all",
                 faults: str | Iterable[str] = "all", n_cases: int = 5, out: str | Path = "ablation_out",
                 size: str = "small", seed: int = 0, planner: Any = None, timeout_s: float = 45.0,
                 max_in_flight: int = 4, address: str | None = None, data: str | Path | None = None,
                 on_row: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Run the ablation and write ``OUT/ablation.json``.

    Args:
        tasks, arms, faults: "all", comma-separated names, or lists.
        n_cases: cases per task (each runs clean + once per fault, in every arm).
        planner: any ``plan``/``revise`` planner; default the offline planner.
        timeout_s: per-call (ReAct) and per-node (engine) timeout; a hang is detected after it.
        max_in_flight: engine cases in flight at once (the ReAct arms run in one thread beside).
        data: read cases from this folder (one sub-folder per task) instead of synthesising.

    Returns:
        The report (also written as ``ablation.json``).
    """
    from ..agents.planners.offline import OfflinePlanner
    from .bench import _cases_for, resolve_tasks

    t0, load_before = time.time(), _load()
    task_ids, arm_ids, fault_ids = resolve_tasks(tasks), resolve_arms(arms), F.resolve_faults(faults)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    planner = planner or OfflinePlanner()
    switch = H.HangSwitch(out / "hangs")
    cases = {t: _cases_for(t, n_cases, out, size, Path(data) if data else None, seed) for t in task_ids}
    jobs: list[Job] = []
    for t in task_ids:
        jobs += prepare_jobs(t, cases[t], load_contract(t), fault_ids, planner, out, seed)
    prep_s = time.time() - t0
    runner = Runner(out, arm_ids, planner, seed, timeout_s, switch, on_row)
    cluster = None
    if "bcer" in arm_ids:
        cluster = _ensure_ray(address, switch)
    t1 = time.time()
    react_arms = [a for a in arm_ids if a != "bcer"]
    memos = {(j.task, j.case.id): Memo() for j in jobs}
    hangs = [j for j in jobs if j.fault == "timeout" and not j.not_applicable]
    rest = [j for j in jobs if j not in hangs]
    # a hanging call mostly sleeps: those runs overlap (ReAct ones freely, engine ones two at a time,
    # since a hung Ray task holds its CPU until the timeout cancels it)
    hang_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ablation-hang")
    futures = [hang_pool.submit(runner.run, a, j, load_contract(j.task), memos[(j.task, j.case.id)])
               for j in hangs for a in react_arms]
    if "bcer" in arm_ids:
        engine_hang_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ablation-engine-hang")
        futures += [engine_hang_pool.submit(runner.run, "bcer", j, load_contract(j.task)) for j in hangs]
    react_thread = threading.Thread(target=_run_react_arms, args=(runner, react_arms, rest, memos), daemon=True)
    react_thread.start()
    if "bcer" in arm_ids:
        with ThreadPoolExecutor(max_workers=max(1, max_in_flight), thread_name_prefix="bcer-ablation") as pool:
            list(pool.map(lambda j: runner.run("bcer", j, load_contract(j.task)), rest))
    for f in futures:
        f.result()
    hang_pool.shutdown()
    engine_s = time.time() - t1
    react_thread.join()
    run_s = time.time() - t1
    by_key = {j.key: j for j in jobs}
    compare_rows(runner.rows, by_key, out)
    order = {a: i for i, a in enumerate(arm_ids)}
    rows = sorted(runner.rows, key=lambda r: (order[r["arm"]], r["task"], r["fault"], r["case"]))
    report = {
        "config": {"tasks": task_ids, "arms": arm_ids, "faults": fault_ids, "n_cases": n_cases, "size": size,
                   "seed": seed, "planner": getattr(planner, "name", type(planner).__name__),
                   "timeout_s": timeout_s, "max_in_flight": max_in_flight, "cluster": cluster,
                   "load_before": load_before, "cpus": os.cpu_count()},
        "arm_docs": {a: ARM_DOCS[a] for a in arm_ids},
        "fault_classes": {f: asdict(F.CATALOGUE[f]) for f in fault_ids},
        "faults_injected": _injected(jobs),
        **summarise(rows, arm_ids, task_ids, fault_ids),
        "rows": rows,
        "timing": {"prepare_s": round(prep_s, 1), "engine_s": round(engine_s, 1), "run_s": round(run_s, 1),
                   "total_s": round(time.time() - t0, 1), "load_after": _load()},
    }
    write_json(report, out / ABLATION_FILE)
    return report


def _injected(jobs: list[Job]) -> list[dict[str, Any]]:
    """What each faulted job's injection changed (or why it did not apply)."""
    return [{"task": j.task, "case": j.case.id, "fault": j.fault, "record": j.record.to_dict() if j.record else None,
             "not_applicable": j.not_applicable} for j in jobs if j.fault != CLEAN]


def merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from runs over disjoint task sets (same arms, faults and case count): rows,
    cells and every summary recomputed from the rows; each part's config and timing kept."""
    arms = reports[0]["config"]["arms"]
    faults = reports[0]["config"]["faults"]
    for r in reports[1:]:
        if r["config"]["arms"] != arms or r["config"]["faults"] != faults:
            raise ToolError(ErrorCode.schema, f"cannot merge: arms {r['config']['arms']} and faults "
                            f"{r['config']['faults']} differ from the first report's {arms} and {faults}",
                            hint="merge only reports run with the same --arms and --faults")
    tasks = [t for r in reports for t in r["config"]["tasks"]]
    if len(set(tasks)) != len(tasks):
        raise ToolError(ErrorCode.schema,
                        f"cannot merge: tasks measured twice: {sorted(t for t in set(tasks) if tasks.count(t) > 1)}",
                        hint="merge reports over disjoint task sets")
    order = {a: i for i, a in enumerate(arms)}
    rows = sorted((row for r in reports for row in r["rows"]),
                  key=lambda x: (order[x["arm"]], x["task"], x["fault"], x["case"]))
    return {"config": {**reports[0]["config"], "tasks": sorted(tasks),
                       "parts": [{"config": r["config"], "command": r.get("command"), "timing": r.get("timing")}
                                 for r in reports]},
            "arm_docs": reports[0]["arm_docs"], "fault_classes": reports[0]["fault_classes"],
            "faults_injected": [f for r in reports for f in r["faults_injected"]],
            **summarise(rows, arms, sorted(tasks), faults), "rows": rows}


def _run_react_arms(runner: Runner, arms: list[str], jobs: list[Job], memos: dict[tuple[str, str], Memo]) -> None:
    """The ReAct arms, case by case in one thread (their tool calls share one memo per case)."""
    by_case: dict[tuple[str, str], list[Job]] = {}
    for j in jobs:
        by_case.setdefault((j.task, j.case.id), []).append(j)
    for key, case_jobs in by_case.items():
        contract = load_contract(key[0])
        for arm in arms:
            for job in case_jobs:
                runner.run(arm, job, contract, memos[key])


def _ensure_ray(address: str | None, switch: H.HangSwitch) -> dict:
    import ray

    from ..engine.cluster import ensure_ray

    if not ray.is_initialized():  # workers must install the hang switch (the timeout fault)
        kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False,
                                  "runtime_env": H.ray_runtime_env(switch)}
        if address is None and not os.environ.get("RAY_ADDRESS"):
            import tempfile

            # one logical CPU over the two a small cluster has: a hung task (the timeout fault) holds
            # its CPU until it is cancelled, and must not stall every other case meanwhile
            kwargs.update(address="local", include_dashboard=False, num_cpus=(os.cpu_count() or 2) + 1,
                          _temp_dir=tempfile.mkdtemp(prefix="bcer_ray_"))
        else:
            kwargs["address"] = address or os.environ["RAY_ADDRESS"]
        ray.init(**kwargs)
    return ensure_ray(address)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


__all__ = ["ABLATION_FILE", "Job", "cell_metrics", "compare_rows", "prepare_jobs", "run_ablation", "score_row",
           "summarise"]
