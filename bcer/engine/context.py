"""Value types shared by the executor, the case state machine and the cohort runner.

Kept apart from ``executor`` and ``case.run`` so neither imports the other's module for them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..contracts.errors import ErrorCode, ToolError
from ..contracts.workflow import Workflow


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
        node_timeout_s: overrides every tool's own ``Resources.timeout_s``; a node running
            longer fails with ``timeout`` (never repaired).
        max_attempts_per_node: safety cap on resubmissions, whatever the Reflector says.
        reflector_timeout_s: how long to wait for the Reflector's verdict.
        read_roots: extra read-only folders tools may open (local model bundles); bcer's
            shipped assets are always readable.
        loader_num_cpus: CPUs of a sequence-load task (gzip decompression is CPU work; a
            fraction lets loads overlap compute but makes Ray start extra workers).
        cache_dir: the content-addressed node cache (None: no cache).
        reviewer: reviews report deliverables before they are written and curates them after
            validation (``bcer.engine.review``); None: the tool's report is written as is.
        audit: write the full audit of the case into its folder (``workflow.json``, the CSV
            twin of a table, ``_DONE`` when it finishes). False (a lean cohort): a case that
            succeeds keeps its deliverables and ``provenance.json``, and the cohort writes its
            ``_DONE`` with its row (``engine.cohort``); a case that does not succeed is always
            audited in full.
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
    cache_dir: Path | None = None
    reviewer: Any = None  # engine.review.ReportReviewer for report deliverables (R4); None: no review
    gpu_concurrency: int | None = None
    model_server: Any = None  # engine.models.ModelServer; None: every node runs as a task
    audit: bool = True

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        self.cache_dir = Path(self.cache_dir) if self.cache_dir else None


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
    # every scalar in long form (outputs.measurement_records), for ``measurements.parquet``
    measurement_rows: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0
    repairs: int = 0
    sr: int | None = None
    tcr: float | None = None
    validations: dict[str, tuple[bool, str]] = field(default_factory=dict)
    workflow: Workflow | None = None
    cache_hits: int = 0
    sr_delivered: int | None = None  # contract validators only; ``sr`` also needs plausibility
    plausibility: list[dict[str, Any]] = field(default_factory=list)  # CheckResult dicts


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


__all__ = ["CaseOutcome", "RunContext", "error_from_ray"]
