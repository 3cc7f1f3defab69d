"""Running many cases at once from ONE driver event loop: bounded cases in flight, one row per
case, resume by ``_DONE``, tables written as cases finish.

Per case: admit (contract inputs) -> plan and compile (once per plan signature for a
deterministic planner, per case otherwise, on a small thread pool) -> submit the whole DAG
-> results through the loop -> validate, provenance, ``_DONE`` -> a row (``result.json`` and
the cohort tables). ``run_cohorts`` drives several cohorts (one per task in ``bcer bench``)
from the same loop. Any exception in one case, not only a ToolError, becomes that case's row
(``internal``, traceback in its trace) while the others go on; Ctrl-C writes the tables of
what finished and cancels the rest.
"""
from __future__ import annotations

import json
import logging
import os
import time
import traceback
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from ..contracts import Case, ErrorCode, TaskContract, ToolError
from ..contracts.sequences import canonical_sequence
from ..io import write_json
from .outputs import write_audit
from . import repair as rp
from .fusion import wide_enough
from .planning import PlanCache, Planner, plan_and_compile
from .models import release_server, resolve_server
from .review import release_reviewer, resolve_reviewer
from .segments import critical_path_s
from .tables import COHORT_FILE, EVENTS_PARQUET, CohortTables, measurements_table, rows_table
from .trace import TraceWriter

log = logging.getLogger(__name__)
ROW_FILE = "result.json"
_TICK_S = 0.25
_HOUSEKEEPING_S = 0.5


@dataclass
class CohortConfig:
    """How a cohort runs. ``goal`` defaults to the contract's goal text.

    Args:
        max_in_flight: cases running at once (back-pressure on the object store); None:
            :func:`default_in_flight` of the cluster.
        cache: the node cache folder (shared across cohorts; None: no cache).
        node_timeout_s: overrides every tool's own time limit.
        repairer: the run's repairer pool (``for_case``) or repairer, built by the caller
            (API, CLI, bench); None: the registered default pool of this run, if any.
        fuse: run each case's whole DAG as one Ray task: "auto" (when the cohorts of the loop
            hold at least 8 cases per CPU and the DAG is small and CPU-only, see
            ``engine.fusion``; otherwise each linear chain of CPU nodes is one task,
            ``engine.segments``), "always" (whenever the DAG allows), "segments" (chains
            only, never whole cases) or "never" (one Ray task per node).
        reviewer: report reviewer (R4, ``engine.review``), or a zero-argument factory called
            once Ray is up (and the reviewer it builds released when the cohort ends).
        gpu_concurrency: at most K bcer nodes per GPU at once (``engine.placement.gpu_share``).
        model_server: serves some nodes from model actors (``engine.models.ModelServer``), or a
            zero-argument factory called once Ray is up (the server it builds is closed when
            the cohort ends).
    """

    out: Path
    planner: Planner
    contract: TaskContract | None = None
    goal: str | None = None
    max_in_flight: int | None = None
    address: str | None = None
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6])
    seed: int = 0
    max_revisions: int = 2
    resume: bool = True
    model_dirs: tuple[str, ...] = ()  # read-only folders for local model bundles (sandbox)
    cache: Path | None = None
    node_timeout_s: float | None = None
    repairer: Any = None
    fuse: Literal["auto", "always", "segments", "never"] = "auto"
    reviewer: Any = None
    gpu_concurrency: int | None = None
    model_server: Any = None
    derivatives: bool = True  # BIDS derivatives, predictions/, DICOM SEG+SR (engine.exports; docs/outputs.md)

    @property
    def goal_text(self) -> str:
        return self.goal or (self.contract.goal if self.contract else "")


@dataclass
class CohortResult:
    out: Path
    rows: list[dict[str, Any]]
    run_id: str

    @property
    def cases(self):
        """pyarrow Table, one row per case."""
        return rows_table(self.rows)

    @property
    def measurements(self):
        """pyarrow Table of every case's measurements in long form (``measurements.parquet``:
        case, deliverable, row, measure, value, text, unit)."""
        return measurements_table(self.rows)

    @property
    def events(self):
        """pyarrow Table of every event of every case (``events.parquet``)."""
        path = self.out / EVENTS_PARQUET
        if path.exists():
            import pyarrow.parquet as pq

            return pq.read_table(path)
        from .trace import events_table

        return events_table(sorted(self.out.glob("*/events.jsonl")))

    def summary(self) -> dict[str, Any]:
        """Counts and means; ``sr`` is delivered AND plausible, ``sr_delivered`` validators only."""
        n = len(self.rows)
        return {"cases": n, "succeeded": sum(r["status"] == "succeeded" for r in self.rows),
                "failed": sum(r["status"] not in ("succeeded",) for r in self.rows),
                "implausible": sum(r["status"] == "implausible" for r in self.rows),
                "resumed": sum(bool(r.get("resumed")) for r in self.rows),
                "sr": sum(r.get("sr") or 0 for r in self.rows) / n if n else 0.0,
                "sr_delivered": sum(_sr_delivered(r) for r in self.rows) / n if n else 0.0,
                "tcr": sum(r.get("tcr") or 0.0 for r in self.rows) / n if n else 0.0}


def _sr_delivered(row: dict[str, Any]) -> int:
    """A row's delivered-SR (rows written before plausibility existed: their ``sr``)."""
    v = row.get("sr_delivered", row.get("sr"))
    return int(v or 0)


def default_in_flight(cluster: dict[str, float]) -> int:
    """Cases in flight by default: eight per CPU (and four per GPU), at least 16. Enough to keep
    every worker busy while the driver records finished cases (measured on tiny cases: 16 in
    flight on 2 CPUs beat 8), few enough to bound the object store (``max_in_flight`` caps it)."""
    return max(16, int(8 * float(cluster.get("CPU", 1)) + 4 * float(cluster.get("GPU", 0))))


def admit_case(case: Case, contract: TaskContract | None) -> None:
    """Reject, with a typed reason, a case the contract cannot accept (before any planning)."""
    if case.issues:
        first = case.issues[0]
        raise ToolError(first.get("code", "schema"), first.get("message", "unreadable case"), first.get("hint", ""),
                        **{k: v for k, v in first.get("context", {}).items() if k != "case"}, case=case.id)
    if contract is None:
        return
    if contract.domain not in ("any", case.domain) and case.domain != "unknown":
        raise ToolError(ErrorCode.input_missing, f"task {contract.id!r} needs a {contract.domain} case, "
                        f"got a {case.domain} case", case=case.id)
    have = {canonical_sequence(s) or s for s in case.sequences}
    for seq in contract.inputs:
        options = [seq] + contract.input_alternatives.get(seq, [])
        if not any(case.sequence_key(o) is not None for o in options):
            raise ToolError(ErrorCode.input_missing, f"task {contract.id!r} needs sequence "
                            f"{' or '.join(options)}; case has {sorted(have)}", case=case.id)


def _error_row(case: Case, cfg: CohortConfig, err: ToolError, status: str, t0: float) -> dict[str, Any]:
    return {"case": case.id, "task": cfg.contract.id if cfg.contract else None, "run": cfg.run_id,
            "status": status, "sr": 0, "sr_delivered": 0, "tcr": 0.0, "plausibility": [], "error_code": err.code.value,
            "error_message": err.message, "error_node": err.context.get("node"),
            "duration_s": round(time.time() - t0, 3), "repairs": 0, "planner": cfg.planner.name,
            "deliverables": {}, "measurements": {}, "measurement_rows": []}


def _outcome_row(case: Case, cfg: CohortConfig, outcome: Any, revisions: int, t0: float) -> dict[str, Any]:
    err = outcome.error or {}
    return {"case": case.id, "task": cfg.contract.id if cfg.contract else None, "run": cfg.run_id,
            "status": outcome.status, "sr": outcome.sr if outcome.sr is not None else int(outcome.status == "succeeded"),
            "sr_delivered": outcome.sr_delivered,
            "tcr": outcome.tcr if outcome.tcr is not None else float(outcome.status == "succeeded"),
            "plausibility": list(outcome.plausibility),
            "error_code": err.get("code"), "error_message": err.get("message"), "error_node": err.get("node"),
            "duration_s": round(time.time() - t0, 3), "repairs": outcome.repairs, "plan_revisions": revisions,
            "planner": cfg.planner.name, "cache_hits": outcome.cache_hits,
            "deliverables": {k: str(Path(v).relative_to(cfg.out)) if Path(v).is_absolute() else str(v)
                             for k, v in outcome.deliverables.items()},
            "measurements": outcome.measurements, "measurement_rows": outcome.measurement_rows,
            "low_confidence": _low_confidence(outcome.measurement_rows)}


def _low_confidence(records: list[dict[str, Any]]) -> bool | None:
    """True when a segmentation of the case flagged itself (its confidence score below its
    stated threshold), False when every scored one passed, None when none was scored."""
    flags = [r["value"] for r in records if r.get("measure") == "low_confidence" and r.get("value") is not None]
    return bool(max(flags)) if flags else None


def _resumed_row(case: Case, cfg: CohortConfig) -> dict[str, Any] | None:
    """The row of a case finished by an earlier run (``_DONE`` present), else None."""
    if not cfg.resume:
        return None
    case_dir = os.path.join(cfg.out, case.id)  # plain strings: 10,000 cases are scanned per resume
    if not os.path.exists(os.path.join(case_dir, "_DONE")):
        return None
    try:
        with open(os.path.join(case_dir, ROW_FILE), "rb") as fh:
            row = json.loads(fh.read())
    except (OSError, ValueError):  # _DONE without its row (killed between the two): run it again
        return None
    row["resumed"] = True
    return row


class _Job:
    """One cohort inside the runner: its cases, config, rows, tables, plans and repairer."""

    def __init__(self, cases: Iterable[Case], cfg: CohortConfig):
        cfg.out = Path(cfg.out).resolve()
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.cfg, self.cases = cfg, list(cases)
        self.rows: dict[str, dict[str, Any]] = {}
        self.todo: deque[Case] = deque()
        self.n_run = 0
        self.active = 0
        self.cap = 1
        self.model_server: Any = None  # resolved from cfg.model_server once Ray is up
        self.plans = PlanCache()
        self.tables = CohortTables(cfg.out, cfg.run_id)
        self.repairer: Any = cfg.repairer
        self.own_repairer = False
        self.reviewer: Any = None  # resolved from cfg.reviewer once Ray is up
        self.cache_dir = Path(cfg.cache).resolve() if cfg.cache else None

    def scan(self, on_case_done: Callable | None) -> None:
        for case in self.cases:
            prev = _resumed_row(case, self.cfg)
            if prev is None:
                self.todo.append(case)
                self.n_run += 1
                continue
            log.info("case %s already done (_DONE present): skipped", case.id)
            self.rows[case.id] = prev
            if on_case_done:
                on_case_done(prev)

    def result(self) -> CohortResult:
        rows = [self.rows[c.id] for c in self.cases if c.id in self.rows]
        return CohortResult(self.cfg.out, rows, self.cfg.run_id)


class _Runner:
    """The loop: admit cases up to each cohort's cap, plan, run, finish, write tables."""

    def __init__(self, jobs: list[_Job], on_case_done: Callable | None, hooks: list, cluster: dict[str, float]):
        from .loop import EventLoop

        self.jobs, self.on_case_done, self.hooks, self.cluster = jobs, on_case_done, hooks, cluster
        self.loop = EventLoop()
        self.active: dict[Any, tuple[_Job, Case]] = {}
        self.planning: dict[Future, tuple[_Job, Case, TraceWriter, float]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.n_run = sum(j.n_run for j in jobs)

    def run(self) -> None:
        last = 0.0
        while True:
            self._admit()
            self._collect_plans()
            if not self.active and not self.planning and not any(j.todo for j in self.jobs):
                break
            if len(self.loop):
                self.loop.poll(0.02 if self.planning else _TICK_S)
            elif self.planning:
                from concurrent.futures import FIRST_COMPLETED, wait

                wait(list(self.planning), timeout=_TICK_S, return_when=FIRST_COMPLETED)
            else:
                for run in list(self.active):  # nothing to wait for: close what is still open
                    if run.finished:  # its recording failed: it must not hold the loop
                        job, _ = self.active.pop(run)
                        job.active -= 1
                    else:
                        run.maybe_done()
            now = time.time()
            if now - last >= _HOUSEKEEPING_S:
                last = now
                self._housekeeping(now)

    def _housekeeping(self, now: float) -> None:
        for run in list(self.active):
            if not run.finished:
                try:
                    run.check_deadlines(now)
                except Exception as e:  # a bug in one case's deadlines fails that case only
                    run.crash(e)
                run.trace.flush()
        for job in self.jobs:
            job.tables.maybe_flush(now)

    # ---- admission and planning ---------------------------------------------------------------
    def _admit(self) -> None:
        known: list[tuple[float, tuple]] = []
        for job in self.jobs:
            while job.todo and job.active < job.cap:
                case = job.todo.popleft()
                job.active += 1
                ready = self._admit_case(job, case)
                if ready is None:
                    continue
                cost = critical_path_s(ready[4][1])
                if cost > 0:
                    known.append((cost, ready))
                else:  # no tool of it seen yet: nothing to order by, so its tasks start at once,
                    self._start_or_reject(*ready)  # running while the next cases are planned
        # Longest expected case first (LPT): Ray dispatches queued tasks in submission order, so
        # the cases whose chains this driver knows to be long get the CPUs first and the short
        # ones fill the gaps.
        for _, ready in sorted(known, key=lambda k: -k[0]):
            self._start_or_reject(*ready)

    def _start_or_reject(self, job: _Job, case: Case, trace: TraceWriter, t0: float, planned: tuple) -> None:
        try:
            self._start(job, case, trace, t0, planned)
        except ToolError as e:
            self._reject(job, case, trace, e.with_context(case=case.id), "rejected", t0)
        except Exception as e:  # a bug: this case's row, not the cohort's end
            self._reject(job, case, trace, _internal(e), "failed", t0, traceback.format_exc())

    def _admit_case(self, job: _Job, case: Case) -> tuple | None:
        """Open the case's trace and plan it: ``(job, case, trace, t0, planned)`` to start when a
        deterministic planner planned it here, None when an LLM plans on a thread (or it was
        rejected)."""
        cfg, t0 = job.cfg, time.time()
        trace: TraceWriter | None = None
        try:
            case_dir = cfg.out / case.id
            case_dir.mkdir(parents=True, exist_ok=True)
            trace = TraceWriter(case_dir, cfg.run_id, case.id, self.hooks, buffered=True)
            trace.emit("case_started")
            admit_case(case, cfg.contract)
            if getattr(cfg.planner, "deterministic", False):
                planned = job.plans.plan(cfg.planner, cfg.goal_text, case, cfg.contract, cfg.max_revisions,
                                         trace.emit)
                return job, case, trace, t0, planned
            else:  # an LLM planner takes seconds: plan on a thread, the loop goes on
                fut = self._planner_pool().submit(plan_and_compile, cfg.planner, cfg.goal_text, case,
                                                  cfg.contract, cfg.max_revisions, trace.emit)
                self.planning[fut] = (job, case, trace, t0)
        except ToolError as e:
            self._reject(job, case, trace, e.with_context(case=case.id), "rejected", t0)
        except Exception as e:  # a crashing planner or a bug: this case's row, not the cohort's end
            self._reject(job, case, trace, _internal(e), "failed", t0, traceback.format_exc())
        return None

    def _planner_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bcer-plan")
        return self._pool

    def _collect_plans(self) -> None:
        for fut in [f for f in self.planning if f.done()]:
            job, case, trace, t0 = self.planning.pop(fut)
            try:
                sketch, wf, revisions = fut.result()
                self._start(job, case, trace, t0, (sketch, wf, revisions, False))
            except ToolError as e:
                self._reject(job, case, trace, e.with_context(case=case.id), "rejected", t0)
            except Exception as e:  # a planner may raise anything: the case fails, the cohort goes on
                self._reject(job, case, trace, _internal(e), "failed", t0, traceback.format_exc())

    def _start(self, job: _Job, case: Case, trace: TraceWriter, t0: float, planned: tuple) -> None:
        from .case.run import CaseRun
        from .context import RunContext
        from .outputs import write_plan

        sketch, wf, revisions, reused = planned
        cfg = job.cfg
        _planner_events(cfg.planner, case.id, trace)  # llm: the LLM calls and plan verdicts of this case
        write_plan(cfg.out / case.id, sketch)
        trace.emit("planned", message=f"{len(sketch.steps)} steps by {cfg.planner.name}",
                   data={"planner": cfg.planner.name, "revisions": revisions, "reused": reused})
        trace.emit("compiled", message=f"{len(wf.nodes)} nodes, {len(wf.deliverables)} deliverables",
                   data={"reused": reused})
        ctx = RunContext(run_id=cfg.run_id, output_dir=cfg.out / case.id, seed=cfg.seed,
                         read_roots=tuple(cfg.model_dirs), node_timeout_s=cfg.node_timeout_s,
                         cache_dir=job.cache_dir, reviewer=job.reviewer, gpu_concurrency=cfg.gpu_concurrency,
                         model_server=job.model_server)
        run = CaseRun(wf, case, ctx, cfg.contract, job.repairer, self.hooks, trace, self.loop, self.cluster,
                      on_done=lambda r: self._finished(job, r, t0, revisions))
        self.active[run] = (job, case)
        # wide = the cases of every cohort this loop drives (bench: all tasks) fill the cluster
        fuse = cfg.fuse == "always" or (cfg.fuse == "auto" and wide_enough(self.n_run, self.cluster.get("CPU", 1)))
        try:
            run.start(announce=False, fuse=fuse, segments=cfg.fuse != "never")
        except Exception as e:  # a bug starting one case fails that case only
            run.crash(e)

    # ---- finishing ----------------------------------------------------------------------------
    def _finished(self, job: _Job, run: Any, t0: float, revisions: int) -> None:
        self.active.pop(run, None)
        try:
            row = _outcome_row(run.case, job.cfg, run.outcome, revisions, t0)
        except Exception as e:  # never leave a case unrecorded (the loop would wait for it forever)
            log.exception("cannot build the row of case %s", run.case.id)
            row = _error_row(run.case, job.cfg, _internal(e), "failed", t0)
        self._record(job, run.case, run.trace, row)

    def _reject(self, job: _Job, case: Case, trace: TraceWriter | None, err: ToolError, status: str,
                t0: float, tb: str | None = None) -> None:
        row = _error_row(case, job.cfg, err, status, t0)
        if trace is not None:
            _planner_events(job.cfg.planner, case.id, trace)  # llm: why no plan (rejected candidates)
            trace.emit("case_finished", error_code=err.code.value, message=f"status={status}: {err.message}",
                       data={"traceback": tb[-4000:]} if tb else None)
        self._record(job, case, trace, row)

    def _record(self, job: _Job, case: Case, trace: TraceWriter | None, row: dict[str, Any]) -> None:
        job.active -= 1
        job.rows[case.id] = row
        lines: list[str] = []
        try:
            write_audit(row, job.cfg.out / case.id / ROW_FILE)
            if trace is not None:
                trace.close()
                lines = trace.all_lines()
        except OSError:  # a full disk: the row stays in the tables, the next run redoes the case
            log.exception("cannot write the row or trace of case %s", case.id)
        job.tables.add(row, lines)
        if self.on_case_done:
            try:
                self.on_case_done(row)
            except Exception:  # a progress display must not end the cohort
                log.exception("on_case_done failed for %s", case.id)

    def interrupt(self) -> None:
        """Ctrl-C: cancel what runs, flush the traces of cases in flight (no _DONE for them)."""
        self.loop.cancel_all()
        for run in list(self.active):
            try:
                run.trace.emit("case_finished", error_code=ErrorCode.internal.value, message="interrupted")
                run.trace.close()
            except Exception:  # Ctrl-C path: every other case must still be flushed
                pass
        for fut, (_, _, trace, _) in self.planning.items():
            fut.cancel()
            trace.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _planner_events(planner: Any, case_id: str, trace: TraceWriter) -> None:
    """A planner's pending events of a case (``pop_events``: LLM calls, rejected and accepted
    plans, fallbacks), made while it planned, into the case's trace with their own times."""
    pop = getattr(planner, "pop_events", None)
    if pop is None:
        return
    try:
        events = pop(case_id)
    except Exception:  # the audit detail is lost, the plan stands
        log.exception("cannot read the planner's events of case %s", case_id)
        return
    for e in events:
        trace.emit(**e)


def _internal(e: Exception) -> ToolError:
    return ToolError(ErrorCode.internal, f"{type(e).__name__}: {e}")


def run_cohorts(cohorts: Iterable[tuple[Iterable[Case], CohortConfig]],
                on_case_done: Callable[[dict[str, Any]], None] | None = None,
                hooks: Iterable = ()) -> list[CohortResult]:
    """Run several cohorts from one driver loop (each with its own folder, cap and tables).

    Returns:
        One CohortResult per cohort, rows in input order.
    """
    from .cluster import ensure_ray

    jobs = [_Job(cases, cfg) for cases, cfg in cohorts]
    for job in jobs:
        job.scan(on_case_done)
    runner: _Runner | None = None
    try:
        if any(j.todo for j in jobs):
            cluster = ensure_ray(next((j.cfg.address for j in jobs if j.cfg.address), None))
            for job in jobs:
                job.cap = max(1, job.cfg.max_in_flight or default_in_flight(cluster))
                if job.repairer is None:
                    job.repairer = rp.default_repairer(job.cfg.run_id) or False
                    job.own_repairer = True
                job.reviewer = resolve_reviewer(job.cfg.reviewer)
                job.model_server = resolve_server(job.cfg.model_server)
            runner = _Runner(jobs, on_case_done, list(hooks), cluster)
            runner.run()
    except KeyboardInterrupt:
        log.warning("interrupted: writing the tables of the cases that finished")
        if runner is not None:
            runner.interrupt()
        for job in jobs:
            _write_outputs(job)
        raise
    finally:
        if runner is not None:
            runner.close()
        for job in jobs:
            if job.own_repairer and hasattr(job.repairer, "close"):
                job.repairer.close()
            if job.reviewer is not None and job.reviewer is not job.cfg.reviewer:  # built here: released here
                release_reviewer(job.reviewer)
            if job.model_server is not None and job.model_server is not job.cfg.model_server:
                release_server(job.model_server)
    for job in jobs:
        _write_outputs(job)
    return [job.result() for job in jobs]


def run_cohort(cases: Iterable[Case], cfg: CohortConfig,
               on_case_done: Callable[[dict[str, Any]], None] | None = None,
               hooks: Iterable = ()) -> CohortResult:
    """Run every case with at most ``cfg.max_in_flight`` cases in flight.

    Cases whose folder already holds ``_DONE`` are skipped (resume) and say so in their row.
    Writes ``cohort.parquet``, ``events.parquet`` and ``dataset_description.json`` under ``cfg.out``.
    """
    return run_cohorts([(cases, cfg)], on_case_done, hooks)[0]


def _write_outputs(job: _Job) -> None:
    from .. import __version__

    result, cfg = job.result(), job.cfg
    job.tables.finalize(result.rows, [c.id for c in job.cases])
    write_json({
        "Name": f"bcer derivatives: {cfg.contract.id if cfg.contract else 'custom plan'}",
        "BIDSVersion": "1.9.0", "DatasetType": "derivative",
        "GeneratedBy": [{"Name": "bcer", "Version": __version__,
                         "Description": f"planner={cfg.planner.name}; goal={cfg.goal_text!r}"}],
        "bcer": {"run_id": result.run_id, "task": cfg.contract.id if cfg.contract else None,
                 "n_cases": len(result.rows), "summary": result.summary(),
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    }, cfg.out / "dataset_description.json")
    if cfg.derivatives:
        from .exports import export_cohort

        export_cohort(cfg.out, job.cases, generated_by={"Name": "bcer", "Version": __version__})


def write_cohort_outputs(result: CohortResult, cfg: CohortConfig) -> None:
    """Write the tables of a finished result (kept for callers of the former API)."""
    job = _Job([], cfg)
    job.rows = {r["case"]: r for r in result.rows}
    job.cases = [Case(id=r["case"], root=str(cfg.out)) for r in result.rows]
    _write_outputs(job)


__all__ = ["COHORT_FILE", "CohortConfig", "CohortResult", "ROW_FILE", "admit_case", "default_in_flight",
           "run_cohort", "run_cohorts", "write_cohort_outputs"]
