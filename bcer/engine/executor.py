"""Running one case's Workflow on Ray: whole-DAG submission, per-field ObjectRefs, local repair.

Each node is one Ray task named ``case/node/tool`` with the ToolSpec's resources and
``num_returns = len(outputs) + 1``: one ObjectRef per output field plus a small meta return,
so a consumer receives exactly the field its token names. Sequences are loaded by one small
task per sequence per case and shared by every consumer. The whole DAG is handed to Ray at
once, chained by ObjectRefs, so independent branches overlap and a chain runs without a
driver round trip per step. A ToolError goes to the repairer (the Reflector); a Patch is
applied to the workflow and only the failed node and its not-yet-run descendants are
resubmitted (finished upstream results stay in the object store). The worker that produced
a deliverable writes and digests it; the driver records events (see ``engine.case.run``).

``run_case_workflow`` and ``run_case_workflows`` hand compiled workflows to the one driver
loop (``engine.driver``), which also runs cohorts (``engine.cohort``: admission and planning too).
"""
from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from ..contracts.case import Case
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.task import TaskContract
from ..contracts.workflow import Workflow
from .case.run import CaseRun
from .context import CaseOutcome, RunContext, error_from_ray
from .driver import TICK_S, Driver
from .trace import TraceWriter, call_hooks

log = logging.getLogger(__name__)


def run_case_workflow(workflow: Workflow, case: Case, ctx: RunContext, *,
                      contract: TaskContract | None = None, reflector: Any = None,
                      hooks: list | tuple = (), segments: bool = True) -> CaseOutcome:
    """Run one case's compiled Workflow on the connected Ray cluster.

    Args:
        workflow: the compiled DAG (a copy is patched and returned in the outcome).
        case: the case (sequences are read from its input root only).
        ctx: run id, case folder, seed, device policy, retry settings, cache, time limit.
        contract: validates deliverables, gives SR/TCR and gates ``_DONE``.
        reflector: a repairer (in-process, or a Ray actor handle), a pool of them
            (``for_case``), or None: the registered default pool of this run (see
            ``engine.repair.set_default_repairer``); without one, failures are not repaired.
        hooks: lifecycle hooks (see ``bcer.engine.trace``).
        segments: run each linear chain of CPU nodes as one task (``engine.segments``); False:
            one Ray task per node.

    Returns:
        A CaseOutcome; never raises for a failing case (errors become ``status``/``error``).

    >>> # doctest: +SKIP
    >>> outcome = run_case_workflow(wf, case, RunContext("r1", Path("out/c1")))
    >>> outcome.status, sorted(outcome.deliverables)
    ('succeeded', ['seg'])
    """
    import ray

    t0 = time.time()
    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    trace = TraceWriter(ctx.output_dir, ctx.run_id, case.id, hooks)
    run: CaseRun | None = None
    try:
        driver = Driver(dict(ray.cluster_resources()), hooks=hooks, housekeeping_s=TICK_S)
        run = CaseRun(workflow, case, ctx, contract, reflector, list(hooks), trace,
                      driver.loop, driver.cluster)
        run.start(segments=segments)
        driver.add(run)
        driver.run()
        outcome = run.outcome
    except Exception as e:  # the promise: a crash never escapes, the case becomes a failed row
        log.exception("case %s crashed in the executor", case.id)
        err = e.to_dict() if isinstance(e, ToolError) else ToolError(
            ErrorCode.internal, f"executor crashed: {type(e).__name__}: {e}").to_dict()
        err.update(node=None, tool=None)
        outcome = CaseOutcome(case.id, "failed", err, node_status=run.state.node_status() if run else {},
                              deliverables=run.state.deliverable_paths() if run else {},
                              repairs=run.state.repairs if run else 0)
        trace.emit("case_finished", error_code=err["code"], message=err["message"],
                   data={"traceback": traceback.format_exc()[-4000:]})
        call_hooks(hooks, "on_case_end", case=case.id, outcome=outcome)
    finally:
        trace.close()
    outcome.duration_s = time.time() - t0
    return outcome


def run_case_workflows(items: list[tuple[Workflow, Case, RunContext]], *, contract: TaskContract | None = None,
                       reflector: Any = None, hooks: list | tuple = (), fuse: bool = False,
                       segments: bool = True) -> list[CaseOutcome]:
    """Run many compiled workflows at once from one event loop (no planning, no cohort tables:
    the cohort runner adds those). Outcomes in input order; a case that crashes the engine
    fails alone (``internal``). ``fuse``: each case's DAG as one task (``engine.fusion``);
    ``segments``: each linear chain as one task (``engine.segments``); neither: one task per node."""
    import ray

    driver = Driver(dict(ray.cluster_resources()), hooks=hooks, housekeeping_s=TICK_S)
    runs: list[CaseRun] = []
    for workflow, case, ctx in items:
        ctx.output_dir.mkdir(parents=True, exist_ok=True)
        trace = TraceWriter(ctx.output_dir, ctx.run_id, case.id, hooks, buffered=True)
        run = CaseRun(workflow, case, ctx, contract, reflector, list(hooks), trace, driver.loop, driver.cluster,
                      on_done=lambda r: r.trace.close())
        runs.append(run)
        try:
            run.start(fuse=fuse, segments=segments)
        except Exception as e:  # a bug starting one case fails that case only
            run.crash(e)
        driver.add(run)
    driver.run()
    return [r.outcome for r in runs]


__all__ = ["CaseOutcome", "RunContext", "error_from_ray", "run_case_workflow", "run_case_workflows"]
