"""Running cohorts: how a cohort runs (``CohortConfig``), its result (``CohortResult``), resume by
``_DONE``, and the cohort-level outputs (tables, ``dataset_description.json``, exports).

``run_cohorts`` hands every cohort to the one driver loop (``engine.driver``), several at once
in ``bcer bench``; each cohort's bookkeeping (``_Job``: cases to do, cap in flight, plan cache,
tables, repairer) records the rows the driver makes. Ctrl-C writes the tables of what finished
and cancels the rest.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal

from ..contracts import Case, TaskContract
from ..io import write_json
from .outputs import write_audit, write_plan
from . import repair as rp
from .driver import Driver
from .models import release_server, resolve_server
from .planning import PlanCache, Planner
from .review import release_reviewer, resolve_reviewer
from .rows import ROW_FILE, CaseRow, resumed_row
from .tables import COHORT_FILE, EVENTS_PARQUET, CohortTables, measurements_table, rows_table
from .trace import TraceWriter

log = logging.getLogger(__name__)


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
    # the full audit of every case in its folder (trace, plan, workflow, row, a table's CSV twin);
    # False: a succeeded case keeps its deliverables, provenance.json and _DONE (holding its row)
    audit: bool = False

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
        rows = [CaseRow.from_dict(r) for r in self.rows]
        n = len(rows)
        return {"cases": n, "succeeded": sum(r.status == "succeeded" for r in rows),
                "failed": sum(r.status != "succeeded" for r in rows),
                "implausible": sum(r.status == "implausible" for r in rows),
                "resumed": sum(r.resumed for r in rows),
                "sr": sum(r.sr for r in rows) / n if n else 0.0,
                "sr_delivered": sum(r.delivered for r in rows) / n if n else 0.0,
                "tcr": sum(r.tcr for r in rows) / n if n else 0.0}


def default_in_flight(cluster: dict[str, float]) -> int:
    """Cases in flight by default: eight per CPU (and four per GPU), at least 16. Enough to keep
    every worker busy while the driver records finished cases (measured on tiny cases: 16 in
    flight on 2 CPUs beat 8), few enough to bound the object store (``max_in_flight`` caps it)."""
    return max(16, int(8 * float(cluster.get("CPU", 1)) + 4 * float(cluster.get("GPU", 0))))


def _resumed_row(case: Case, cfg: CohortConfig) -> CaseRow | None:
    """The row of a case finished by an earlier run (``_DONE`` present), else None."""
    if not cfg.resume:
        return None
    return resumed_row(os.path.join(cfg.out, case.id))  # plain strings: 10,000 cases are scanned per resume


class _Job:
    """One cohort in the driver loop: its cases, config, rows, tables, plans and repairer."""

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
        self.on_case_done: Callable[[dict[str, Any]], None] | None = None

    def scan(self, on_case_done: Callable | None) -> None:
        self.on_case_done = on_case_done
        for case in self.cases:
            prev = _resumed_row(case, self.cfg)
            if prev is None:
                self.todo.append(case)
                self.n_run += 1
                continue
            log.info("case %s already done (_DONE present): skipped", case.id)
            self.rows[case.id] = row = prev.to_dict()
            if on_case_done:
                on_case_done(row)

    def record(self, case: Case, trace: TraceWriter | None, case_row: CaseRow, sketch: Any = None) -> None:
        """A case of this cohort finished (the driver calls this once per case): its row into
        ``result.json`` (a lean cohort: into ``_DONE`` for a case that succeeded), the tables and
        the progress callback. A case that did not succeed keeps its full audit in its folder
        (row, trace, plan, workflow), whatever the cohort's ``audit``."""
        self.active -= 1
        self.rows[case.id] = row = case_row.to_dict()
        lines: list[str] = []
        folder = self.cfg.out / case.id
        lean_done = not self.cfg.audit and row["status"] == "succeeded"
        try:
            if not lean_done:
                write_audit(row, folder / ROW_FILE)
                if not self.cfg.audit and trace is not None:
                    trace.save()
                if not self.cfg.audit and sketch is not None:
                    write_plan(folder, sketch)
            elif trace is not None and trace.had_history:  # an earlier run's row would contradict _DONE
                (folder / ROW_FILE).unlink(missing_ok=True)  # (no history, no row: no syscall per case)
            if trace is not None:
                trace.close()
                lines = trace.all_lines()
        except OSError:  # a full disk: the row stays in the tables, the next run redoes the case
            log.exception("cannot write the row or trace of case %s", case.id)
        # lean: the row is the done marker, written once the tables hold the case (resume reads it)
        self.tables.add(row, lines, done=folder if lean_done else None)
        if self.on_case_done:
            try:
                self.on_case_done(row)
            except Exception:  # a progress display must not end the cohort
                log.exception("on_case_done failed for %s", case.id)

    def result(self) -> CohortResult:
        rows = [self.rows[c.id] for c in self.cases if c.id in self.rows]
        return CohortResult(self.cfg.out, rows, self.cfg.run_id)


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
    driver: Driver | None = None
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
            driver = Driver(cluster, jobs, list(hooks))
            driver.run()
    except KeyboardInterrupt:
        log.warning("interrupted: writing the tables of the cases that finished")
        if driver is not None:
            driver.interrupt()
        for job in jobs:
            _write_outputs(job)
        raise
    finally:
        if driver is not None:
            driver.close()
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


__all__ = ["COHORT_FILE", "CohortConfig", "CohortResult", "ROW_FILE", "default_in_flight",
           "run_cohort", "run_cohorts", "write_cohort_outputs"]
