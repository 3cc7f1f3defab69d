"""The one driver loop: every case of every cohort (or a list of compiled workflows) runs from
this loop, whatever the number of cases.

Per case: admit (``admit_case``: the contract's inputs) -> plan and compile (once per plan
signature for a deterministic planner, per case otherwise, on a small thread pool) -> a
``case.run.CaseRun`` submits its whole DAG -> results through the event loop
(``engine.loop``) -> validate, provenance, ``_DONE`` -> one row (``engine.rows``) into its
cohort's tables. Cases already compiled (``executor.run_case_workflows``) skip the first two
steps (``Driver.add``). Any exception in one case, not only a ToolError, becomes that case's
row (``internal``, traceback in its trace) while the others go on.

A cohort is handed in as a job (``engine.cohort``'s bookkeeping: its config, cases to do, cap
on cases in flight, plan cache, tables, repairer); the driver reads those fields and calls
``job.record(...)`` with each finished row, so it never imports the cohort module.
"""
from __future__ import annotations

import logging
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from ..contracts import Case, ErrorCode, TaskContract, ToolError
from ..contracts.sequences import canonical_sequence
from .case.run import CaseRun
from .context import RunContext
from .fusion import wide_enough
from .loop import EventLoop
from .outputs import write_plan
from .planning import plan_and_compile
from .rows import CaseRow
from .segments import critical_path_s
from .trace import TraceWriter

log = logging.getLogger(__name__)
TICK_S = 0.25          # longest wait for one result before the loop looks around again
HOUSEKEEPING_S = 0.5   # time-limit backstops, trace and table flushes of a cohort


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


class Driver:
    """The loop: admit cases up to each cohort's cap, plan, run, finish, record rows.

    Args:
        cluster: ``ray.cluster_resources()`` of the connected cluster.
        jobs: the cohorts to run (``engine.cohort``); none when runs are added with :meth:`add`.
        hooks: lifecycle hooks of every case (``engine.trace``).
        housekeeping_s: how often time limits are checked and traces flushed.
    """

    def __init__(self, cluster: dict[str, float], jobs: list[Any] = (), hooks: list | tuple = (),
                 housekeeping_s: float = HOUSEKEEPING_S):
        self.jobs, self.hooks, self.cluster = list(jobs), list(hooks), cluster
        self.housekeeping_s = housekeeping_s
        self.loop = EventLoop()
        self.active: dict[CaseRun, Any] = {}   # run -> its job (None: added as a compiled run)
        self.planning: dict[Future, tuple[Any, Case, TraceWriter, float]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.n_run = sum(j.n_run for j in self.jobs)

    def add(self, run: CaseRun) -> None:
        """Drive a run built on this driver's loop (and started) until it finishes."""
        self.active[run] = None

    def run(self) -> None:
        last = 0.0
        while True:
            self._admit()
            self._collect_plans()
            for run in [r for r, job in self.active.items() if job is None and r.finished]:
                self.active.pop(run)
            if not self.active and not self.planning and not any(j.todo for j in self.jobs):
                break
            if len(self.loop):
                self.loop.poll(0.02 if self.planning else TICK_S)
            elif self.planning:
                wait(list(self.planning), timeout=TICK_S, return_when=FIRST_COMPLETED)
            else:
                self._close_idle()
            now = time.time()
            if now - last >= self.housekeeping_s:
                last = now
                self._housekeeping(now)

    def _close_idle(self) -> None:
        """Nothing left to wait for: close every case still open."""
        for run in list(self.active):
            if run.finished:  # its recording failed: it must not hold the loop
                job = self.active.pop(run)
                if job is not None:
                    job.active -= 1
                continue
            run.maybe_done()
            if not run.finished:  # open tags nobody watches: it can never finish by itself
                run.crash(RuntimeError("nothing left to wait for, yet the case is still open"))

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

    def _start_or_reject(self, job: Any, case: Case, trace: TraceWriter, t0: float, planned: tuple) -> None:
        try:
            self._start(job, case, trace, t0, planned)
        except ToolError as e:
            self._reject(job, case, trace, e.with_context(case=case.id), "rejected", t0)
        except Exception as e:  # a bug: this case's row, not the cohort's end
            self._reject(job, case, trace, _internal(e), "failed", t0, traceback.format_exc())

    def _admit_case(self, job: Any, case: Case) -> tuple | None:
        """Open the case's trace and plan it: ``(job, case, trace, t0, planned)`` to start when a
        deterministic planner planned it here, None when an LLM plans on a thread (or it was
        rejected)."""
        cfg, t0 = job.cfg, time.time()
        trace: TraceWriter | None = None
        try:
            case_dir = cfg.out / case.id
            case_dir.mkdir(parents=True, exist_ok=True)
            trace = TraceWriter(case_dir, cfg.run_id, case.id, self.hooks, buffered=True, persist=cfg.audit)
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

    def _start(self, job: Any, case: Case, trace: TraceWriter, t0: float, planned: tuple) -> None:
        sketch, wf, revisions, reused = planned
        cfg = job.cfg
        _planner_events(cfg.planner, case.id, trace)  # llm: the LLM calls and plan verdicts of this case
        if cfg.audit:  # lean: written at the end only if the case does not succeed (job.record)
            write_plan(cfg.out / case.id, sketch)
        trace.emit("planned", message=f"{len(sketch.steps)} steps by {cfg.planner.name}",
                   data={"planner": cfg.planner.name, "revisions": revisions, "reused": reused})
        trace.emit("compiled", message=f"{len(wf.nodes)} nodes, {len(wf.deliverables)} deliverables",
                   data={"reused": reused})
        ctx = RunContext(run_id=cfg.run_id, output_dir=cfg.out / case.id, seed=cfg.seed,
                         read_roots=tuple(cfg.model_dirs), node_timeout_s=cfg.node_timeout_s,
                         cache_dir=job.cache_dir, reviewer=job.reviewer, gpu_concurrency=cfg.gpu_concurrency,
                         model_server=job.model_server, audit=cfg.audit)
        run = CaseRun(wf, case, ctx, cfg.contract, job.repairer, self.hooks, trace, self.loop, self.cluster,
                      on_done=lambda r: self._finished(job, r, t0, revisions))
        run.sketch = sketch  # the plan as emitted: a lean cohort writes it only for a case that fails
        self.active[run] = job
        # wide = the cases of every cohort this loop drives (bench: all tasks) fill the cluster
        fuse = cfg.fuse == "always" or (cfg.fuse == "auto" and wide_enough(self.n_run, self.cluster.get("CPU", 1)))
        try:
            run.start(announce=False, fuse=fuse, segments=cfg.fuse != "never")
        except Exception as e:  # a bug starting one case fails that case only
            run.crash(e)

    # ---- finishing ----------------------------------------------------------------------------
    def _finished(self, job: Any, run: CaseRun, t0: float, revisions: int) -> None:
        self.active.pop(run, None)
        try:
            row = CaseRow.from_outcome(run.case, job.cfg, run.outcome, revisions, t0)
        except Exception as e:  # never leave a case unrecorded (the loop would wait for it forever)
            log.exception("cannot build the row of case %s", run.case.id)
            row = CaseRow.from_error(run.case, job.cfg, _internal(e), "failed", t0)
        job.record(run.case, run.trace, row, run.sketch)

    def _reject(self, job: Any, case: Case, trace: TraceWriter | None, err: ToolError, status: str,
                t0: float, tb: str | None = None) -> None:
        row = CaseRow.from_error(case, job.cfg, err, status, t0)
        if trace is not None:
            _planner_events(job.cfg.planner, case.id, trace)  # llm: why no plan (rejected candidates)
            trace.emit("case_finished", error_code=err.code.value, message=f"status={status}: {err.message}",
                       data={"traceback": tb[-4000:]} if tb else None)
        job.record(case, trace, row)

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


__all__ = ["Driver", "HOUSEKEEPING_S", "TICK_S", "admit_case"]
