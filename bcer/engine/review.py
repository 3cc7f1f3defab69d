"""The engine's side of report review (the R4 loop): the protocol a reviewer implements, and
the two calls the executor makes.

1. ``review_in_run(run, node, report)``: when a node's deliverable is a ``report``, before it
   is written. The reviewer returns the reviewed report (written as the deliverable) and the
   events of the loop (written to the case trace on that node).
2. ``curate_in_run(run, status)``: once, at case end, after contract validation. The reviewer
   may add the reviewed report to its exemplar memory (it does so only for a case that
   validated and a report without material issues).

The engine never imports the actors: the API/CLI build a reviewer (``bcer.agents.r4.reviewer``)
and hand it in through ``CohortConfig.reviewer`` -> ``RunContext.reviewer``, like the
Reflector. A reviewer that fails leaves the tool's report in place and says so in the trace;
it never fails the case.

With a reviewer set, the worker that makes a report does not write it: the case's driver
loop hands the report to :func:`submit_review`, which reviews and writes it (atomically) on a
small thread pool, so a slow reviewer (an LLM drafter) never holds the loop that drives the
other cases; the result comes back to the case through that loop. A case with such a report
is never fused into one task (its report must pass through here). A report and its inputs
are small (tables, a classification, findings), the embedding model and the FAISS index live
in the shared memory actor and the LLM (if any) behind its backend.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
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
    from .noderun import _pluck
    from .tokens import parse_token

    inputs = {}
    for port, raw in node.inputs.items():
        tok = parse_token(raw)
        up = run.state.nodes.get(tok.name)
        if tok.scope == "node" and up is not None and tok.field in up.refs:
            inputs[port] = _pluck(run.fetch(tok.name, tok.field), tuple(tok.path[1:]))
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
        contract = run.state.contract
        req = ReviewRequest(case_id=run.case.id, task=contract.id if contract else None, run_id=run.ctx.run_id,
                            node=node.id, report=report, inputs=_node_inputs(run, node), params=dict(node.params),
                            history=str(run.case.metadata.get("history", "") or ""), metadata=dict(run.case.metadata))
        result = reviewer.review(req)
    except Exception as e:  # a broken reviewer must not cost the case its report
        log.exception("report review failed on %s/%s", run.case.id, node.id)
        run.trace.emit("r4_reflect", node=node.id, tool=node.tool, error_code="internal",
                       message=f"review failed, tool report kept: {type(e).__name__}: {e}")
        return report
    _emit(run, node, result.events)
    run.state.nodes[node.id].reviewed = result.report  # one field per node: safe from the review threads
    return result.report


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="bcer-review")
        return _POOL


def review_and_write(run: Any, node: Any, target: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fetch the node's report, review it, write it where the contract says (atomic temp file +
    rename, sandbox-checked) and digest it. Returns (the ``written`` record, measurements)."""
    from ..contracts.artifacts import kind_of
    from . import outputs as out
    from .digest import artifact_digest, file_digest

    report = review_in_run(run, node, run.fetch(node.id, target["field"]))
    name = target["file"] if Path(target["file"]).suffix else out.default_file(target["file"], kind_of(report))
    files = out.write_artifact(report, run.sandbox.check_write(run.ctx.output_dir / name))
    written = {"node": node.id, "field": target["field"], "files": [str(f) for f in files],
               "file_digests": {f.name: file_digest(f) for f in files}, "artifact_digest": artifact_digest(report),
               "reviewed": True}
    return written, out.measurements_of(target["name"], report)


def submit_review(run: Any, node: Any, target: dict[str, str]) -> Future:
    """:func:`review_and_write` on the review threads; the case's loop waits for the Future."""
    return _pool().submit(review_and_write, run, node, target)


def curate_in_run(run: Any, status: str) -> None:
    """Offer every reviewed report of the case to the reviewer's memory (after validation)."""
    reviewer = getattr(run.ctx, "reviewer", None)
    contract = run.state.contract
    reviewed = {n: s.reviewed for n, s in run.state.nodes.items() if s.reviewed is not None}
    for node_id, report in reviewed.items():
        node = run.wf.node(node_id)
        try:
            res = reviewer.curate(CurateRequest(case_id=run.case.id, task=contract.id if contract else None,
                                                run_id=run.ctx.run_id, report=report,
                                                verified=status == "succeeded", status=status))
        except Exception as e:  # curation is optional: any failure is traced, the case goes on
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
        except Exception:  # best-effort cleanup: a reviewer may raise anything
            log.exception("closing the report reviewer failed")


__all__ = ["CurateRequest", "ReportReviewer", "ReviewRequest", "ReviewResult", "curate_in_run", "release_reviewer",
           "resolve_reviewer", "review_and_write", "review_in_run", "submit_review"]
