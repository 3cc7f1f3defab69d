"""Running one case's Workflow on Ray: per-field ObjectRefs, GPU fallback, local repair.

Each node is one Ray task named ``case:node:tool`` with the ToolSpec's resources and
``num_returns = len(outputs) + 1``: one ObjectRef per output field plus a small meta return,
so a consumer receives exactly the field its token names. Sequences are loaded by one
small task per sequence per case and shared by every consumer. Nodes are submitted as soon
as their inputs exist, and the driver waits on the whole in-flight set, so independent
branches overlap. A ToolError goes to the Reflector; a Patch is applied to the running node
and only that node is resubmitted (finished upstream results stay in the object store).

Trace semantics: ``started`` is written when a node is handed to Ray; ``succeeded`` carries
the worker's own end time (``time``) and run time (``duration_s``), so the interval in
which a node really ran is ``[time - duration_s, time]``.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..contracts.case import Case
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.task import TaskContract
from ..contracts.workflow import Workflow
from .noderun import load_sequence_task, run_node
from .trace import TraceWriter, call_hooks

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """Where and how a case runs.

    Args:
        run_id: written on every event and in provenance.
        output_dir: the case folder (deliverables, trace, provenance).
        seed: bound to ``@runtime.seed``.
        device_policy: "auto" (GPU when the cluster has one) or "cpu" (never ask for GPUs).
        task_max_retries: Ray retries of a task whose worker died (system failures only).
        write_intermediates: also write every node output under ``intermediates/``.
        node_timeout_s: a node running longer is cancelled and fails with ``timeout``.
        max_attempts_per_node: safety cap on resubmissions, whatever the Reflector says.
        reflector_timeout_s: how long to wait for the Reflector's verdict.
        read_roots: extra read-only folders tools may open (local model bundles); bcer's
            shipped assets are always readable.
        reviewer: reviews report deliverables before they are written and curates them after
            validation (``bcer.engine.review``); None writes the tool's report as is.
        loader_num_cpus: CPUs of a sequence-load task (gzip decompression is CPU work; a
            fraction lets loads overlap compute but makes Ray start extra workers).
    """

    run_id: str
    output_dir: Path
    seed: int = 0
    device_policy: Literal["auto", "cpu"] = "auto"
    task_max_retries: int = 3
    write_intermediates: bool = False
    node_timeout_s: float | None = None
    max_attempts_per_node: int = 4
    reflector_timeout_s: float = 120.0
    loader_num_cpus: float = 1.0
    read_roots: tuple[str, ...] = ()
    reviewer: Any = None  # engine.review.ReportReviewer for report deliverables (R4); None: no review

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)


@dataclass
class CaseOutcome:
    """What happened to one case (the cohort row is built from this)."""

    case_id: str
    status: Literal["succeeded", "failed", "halted", "implausible"]
    error: dict[str, Any] | None = None
    deliverables: dict[str, Path] = field(default_factory=dict)
    node_status: dict[str, str] = field(default_factory=dict)
    milestones_done: list[str] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    repairs: int = 0
    sr: int | None = None
    tcr: float | None = None
    validations: dict[str, tuple[bool, str]] = field(default_factory=dict)
    workflow: Workflow | None = None
    sr_delivered: int | None = None  # contract validators only; ``sr`` also needs plausibility
    plausibility: list[dict[str, Any]] = field(default_factory=list)  # CheckResult dicts


@functools.cache
def _remote_node():
    import ray

    return ray.remote(run_node)


@functools.cache
def _remote_loader():
    import ray

    return ray.remote(num_returns=2)(load_sequence_task)


@functools.cache
def _system_errors() -> dict[type, ErrorCode]:
    """Ray exceptions that mean "Ray gave up on the task" and their bcer codes (most specific first)."""
    import ray.exceptions as rex

    return {rex.OutOfMemoryError: ErrorCode.resource, rex.TaskCancelledError: ErrorCode.timeout,
            rex.WorkerCrashedError: ErrorCode.worker_lost, rex.NodeDiedError: ErrorCode.worker_lost,
            rex.ObjectLostError: ErrorCode.worker_lost, rex.OwnerDiedError: ErrorCode.worker_lost,
            rex.ActorDiedError: ErrorCode.worker_lost}


def error_from_ray(exc: BaseException) -> dict[str, Any]:
    """A ToolError dict for an exception raised by ``ray.get`` on a task result."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ToolError):
            return cause.to_dict()
        if cause is not None and not isinstance(cause, rex.RayTaskError):
            exc = cause
    for cls, code in _system_errors().items():
        if isinstance(exc, cls):
            return ToolError(code, f"Ray gave up on the task: {type(exc).__name__}: {str(exc)[:300]}").to_dict()
    return ToolError(ErrorCode.internal, f"{type(exc).__name__}: {str(exc)[:300]}").to_dict()


def run_case_workflow(workflow: Workflow, case: Case, ctx: RunContext, *,
                      contract: TaskContract | None = None, reflector: Any = None,
                      hooks: list | tuple = ()) -> CaseOutcome:
    """Run one case's compiled Workflow on the connected Ray cluster.

    Args:
        workflow: the compiled DAG (a copy is patched and returned in the outcome).
        case: the case (sequences are read from its input root only).
        ctx: run id, case folder, seed, device policy, retry settings.
        contract: validates deliverables, gives SR/TCR and gates ``_DONE``.
        reflector: a Reflector actor handle, an in-process Reflector, or None (get or
            create the shared actor; without one, tool failures are not repaired).
        hooks: lifecycle hooks (see ``bcer.engine.trace``).

    Returns:
        A CaseOutcome; never raises for a failing case (errors become ``status``/``error``).

    >>> # doctest: +SKIP
    >>> outcome = run_case_workflow(wf, case, RunContext("r1", Path("out/c1")))
    >>> outcome.status, sorted(outcome.deliverables)
    ('succeeded', ['seg'])
    """
    from .caserun import CaseRun

    t0 = time.time()
    ctx.output_dir.mkdir(parents=True, exist_ok=True)
    trace = TraceWriter(ctx.output_dir, ctx.run_id, case.id, hooks)
    run: CaseRun | None = None
    try:
        run = CaseRun(workflow, case, ctx, contract, reflector, list(hooks), trace)
        outcome = run.execute()
    except Exception as e:  # the promise: a crash never escapes, the case becomes a failed row
        log.exception("case %s crashed in the executor", case.id)
        err = e.to_dict() if isinstance(e, ToolError) else ToolError(
            ErrorCode.internal, f"executor crashed: {type(e).__name__}: {e}").to_dict()
        err.update(node=None, tool=None)
        outcome = CaseOutcome(case.id, "failed", err, node_status=run.status if run else {},
                              deliverables=run.deliverable_paths() if run else {},
                              repairs=run.repairs if run else 0)
        trace.emit("case_finished", error_code=err["code"], message=err["message"])
    finally:
        trace.close()
    outcome.duration_s = time.time() - t0
    call_hooks(hooks, "on_case_end", case=case.id, outcome=outcome)
    return outcome


__all__ = ["CaseOutcome", "RunContext", "error_from_ray", "run_case_workflow"]
