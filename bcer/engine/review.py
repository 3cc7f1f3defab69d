"""The engine's side of report review (the R4 loop): the protocol a reviewer implements, and
the two calls the executor makes.

1. ``review_in_run(run, node, report)``: when a node's deliverable is a ``report``, before it
   is written. The reviewer returns the reviewed report (written as the deliverable) and the
   events of the loop (written to the case trace on that node).
2. ``curate_in_run(run, status)``: once, at case end, after contract validation. The reviewer
   may add the reviewed report to its exemplar memory (it does so only for a case that
   validated and a report without material issues).

The engine never imports the actors: the API/CLI build a reviewer (``bcer.actors.r4.reviewer``)
and hand it in through ``CohortConfig.reviewer`` -> ``RunContext.reviewer``, like the
Reflector. A reviewer that fails leaves the tool's report in place and says so in the trace;
it never fails the case. Reviewing runs in the driver's case thread: a report and its inputs
are small (tables, a classification, findings), the embedding model and the FAISS index live
in the shared memory actor and the LLM (if any) behind its backend, so the remaining work is
milliseconds of Python.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..contracts.artifacts import Report

log = logging.getLogger(__name__)


@dataclass
class ReviewRequest:
    """A report deliverable and what it was written from."""

    case_id: str
    task: str | None
    run_id: str
    node: str
    report: Report
    inputs: dict[str, Any]            # report node input port -> artifact (tables, classification, findings)
    params: dict[str, Any] = field(default_factory=dict)  # the report node's params (title, domain, decimals)
    history: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReviewResult:
    report: Report
    events: list[dict[str, Any]] = field(default_factory=list)  # {kind, message, data}
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class CurateRequest:
    case_id: str
    task: str | None
    run_id: str
    report: Report
    verified: bool   # the case passed its contract (and plausibility, where checked)
    status: str


@runtime_checkable
class ReportReviewer(Protocol):
    def review(self, request: ReviewRequest) -> ReviewResult: ...

    def curate(self, request: CurateRequest) -> dict[str, Any] | None: ...


def _node_inputs(run: Any, node: Any) -> dict[str, Any]:
    import ray

    from .noderun import _pluck
    from .tokens import parse_token

    inputs = {}
    for port, raw in node.inputs.items():
        tok = parse_token(raw)
        if tok.scope == "node" and tok.field in run.refs.get(tok.name, {}):
            inputs[port] = _pluck(ray.get(run.refs[tok.name][tok.field]), tuple(tok.path[1:]))
    return inputs


def _emit(run: Any, node: Any, events: list[dict[str, Any]]) -> None:
    for e in events:
        run.trace.emit(e["kind"], node=node.id, tool=node.tool, message=e.get("message"), data=e.get("data"))


def review_in_run(run: Any, node: Any, report: Report) -> Report:
    """The reviewed report (or ``report`` unchanged without a reviewer or when it fails)."""
    reviewer = getattr(run.ctx, "reviewer", None)
    if reviewer is None:
        return report
    try:
        req = ReviewRequest(case_id=run.case.id, task=run.contract.id if run.contract else None, run_id=run.ctx.run_id,
                            node=node.id, report=report, inputs=_node_inputs(run, node), params=dict(node.params),
                            history=str(run.case.metadata.get("history", "") or ""), metadata=dict(run.case.metadata))
        result = reviewer.review(req)
    except Exception as e:  # a broken reviewer must not cost the case its report
        log.exception("report review failed on %s/%s", run.case.id, node.id)
        run.trace.emit("r4_reflect", node=node.id, tool=node.tool, error_code="internal",
                       message=f"review failed, tool report kept: {type(e).__name__}: {e}")
        return report
    _emit(run, node, result.events)
    run.reviewed = dict(getattr(run, "reviewed", {}) or {}, **{node.id: result.report})
    return result.report


def curate_in_run(run: Any, status: str) -> None:
    """Offer every reviewed report of the case to the reviewer's memory (after validation)."""
    reviewer = getattr(run.ctx, "reviewer", None)
    for node_id, report in (getattr(run, "reviewed", None) or {}).items():
        node = run.wf.node(node_id)
        try:
            res = reviewer.curate(CurateRequest(case_id=run.case.id, task=run.contract.id if run.contract else None,
                                                run_id=run.ctx.run_id, report=report,
                                                verified=status == "succeeded", status=status))
        except Exception as e:
            log.exception("curation failed on %s/%s", run.case.id, node_id)
            run.trace.emit("memory_add", node=node_id, tool=node.tool, error_code="internal",
                           message=f"curation failed: {type(e).__name__}: {e}")
            continue
        if res:
            run.trace.emit("memory_add", node=node_id, tool=node.tool, message=f"{res.get('action')}: {res.get('reason')}",
                           data=res)


def resolve_reviewer(reviewer: Any) -> Any:
    """A reviewer object, or the one a zero-argument factory builds (once Ray is up)."""
    if reviewer is None or isinstance(reviewer, ReportReviewer):
        return reviewer
    return reviewer() if callable(reviewer) else reviewer


def release_reviewer(reviewer: Any) -> None:
    close = getattr(reviewer, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            log.exception("closing the report reviewer failed")


__all__ = ["CurateRequest", "ReportReviewer", "ReviewRequest", "ReviewResult", "curate_in_run", "release_reviewer",
           "resolve_reviewer", "review_in_run"]
