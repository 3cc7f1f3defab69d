"""Closing a case: contract validation, plausibility checks, SR/TCR, final workflow and
provenance, then ``_DONE``.

SR is "delivered and plausible": ``sr_delivered`` is the contract validators' verdict alone;
a delivered case that fails a plausibility check ends ``implausible`` with SR 0, error code
``value_range`` and the failed check named, and gets no ``_DONE``.
"""
from __future__ import annotations

import logging
from typing import Any

from ...contracts.errors import ErrorCode
from .. import outputs as out
from ..plausibility import CheckResult, failed, run_checks, summary_message
from ..validate import score, validate_deliverables

log = logging.getLogger(__name__)


def _validate(run: Any) -> tuple[dict[str, tuple[bool, str]], int | None, float | None]:
    st = run.state
    if st.contract is None:  # no contract: SR = every required node ran, TCR = the fraction that did
        required = [n.id for n in st.wf.nodes if n.required]
        done = sum(st.status(n) == "succeeded" for n in required)
        ok = st.error is None and done == len(required)
        return {}, int(ok), (done / len(required) if required else 1.0)
    checks = validate_deliverables(st.contract, st.ctx.output_dir, st.case)
    for name, (ok, why) in checks.items():
        run.trace.emit("validated", node=st.written.get(name, {}).get("node"), message=f"{name}: {why}",
                       error_code=None if ok else ErrorCode.schema.value)
    sr, tcr = score(st.contract, st.milestones, checks)
    if st.error is None and not sr:
        bad = next((n for n, (ok, _) in checks.items() if not ok), None)
        missing = [m for m in st.contract.milestones if m not in st.milestones]
        msg = (f"deliverable {bad!r} failed validation: {checks[bad][1]}" if bad
               else f"milestones not reached: {missing}")
        st.error = {"code": ErrorCode.schema.value, "message": msg, "node": None, "tool": None}
    return checks, sr, tcr


def _plausibility(run: Any, checks: dict[str, tuple[bool, str]]) -> list[CheckResult]:
    """The contract's plausibility checks over the written deliverables, one event each."""
    st = run.state
    if st.contract is None or not st.contract.plausibility:
        return []
    results = run_checks(st.contract, st.case, st.ctx.output_dir, checks, loaded=run.loaded_sequence)
    for r in results:
        run.trace.emit("plausibility", node=st.written.get(r.deliverable, {}).get("node"),
                       message=f"{r.check} on {r.deliverable}: {r.message}", data=r.to_dict(),
                       error_code=ErrorCode.value_range.value if r.ok is False else None)
    return results


def _implausible_error(run: Any, results: list[CheckResult]) -> dict[str, Any]:
    first = failed(results)[0]
    node = run.state.written.get(first.deliverable, {}).get("node")
    tool = next((n.tool for n in run.state.wf.nodes if n.id == node), None)
    return {"code": ErrorCode.value_range.value, "message": summary_message(results), "node": node, "tool": tool,
            "check": first.check, "value": first.value, "limit": first.limit}


def finish_case(run: Any, outcome_cls: type) -> Any:
    """Validate, check plausibility, score, write ``workflow.json`` (with the audit, or for a case
    that did not succeed) and ``provenance.json``; ``_DONE`` last (with the audit: a lean cohort
    writes it with the row), only for a case whose contract validated and whose deliverables are
    plausible (without a contract: every required node succeeded, and SR/TCR count required
    nodes instead of milestones and deliverables)."""
    st = run.state
    checks, sr, tcr = _validate(run)
    plaus = _plausibility(run, checks)
    status = "succeeded" if st.error is None else ("halted" if st.halted else "failed")
    sr_delivered = sr
    if failed(plaus):
        sr = 0
        if status == "succeeded":
            status, st.error = "implausible", _implausible_error(run, plaus)
    audit = st.ctx.audit or status != "succeeded"  # a case that did not succeed is audited in full
    if audit:
        out.write_workflow(st.ctx.output_dir, st.wf)
    # kind and options too: with them the record alone re-reads the input exactly (e.g. k-space, not
    # the reconstruction stored beside it in the same .h5)
    seqs = st.case.sequences
    inputs = {k: {"path": str(seqs[k].path), "format": seqs[k].format, "kind": seqs[k].kind.value,
                  "options": seqs[k].options or None, "sha256": m.get("sha256"), "frames": m.get("frames") or None}
              for k, seq in st.seqs.items() if (m := seq.meta or {}).get("ok")}
    prov = out.build_provenance(st.wf, st.records(), st.written, inputs, st.ctx.run_id)
    prov["dag"] = {"nodes": [{"id": n.id, "tool": n.tool} for n in st.wf.nodes],  # the pages draw it
                   "edges": [list(e) for e in st.wf.edges]}
    if plaus:
        prov["plausibility"] = [r.to_dict() for r in plaus]
    out.write_provenance(st.ctx.output_dir, prov)
    outcome = outcome_cls(
        case_id=st.case.id, status=status, error=st.error, deliverables=st.deliverable_paths(),
        node_status=st.node_status(), milestones_done=list(st.milestones), measurements=dict(st.measurements),
        measurement_rows=out.case_records(st.written), repairs=st.repairs, sr=sr, tcr=tcr, validations=checks,
        workflow=st.wf, sr_delivered=sr_delivered, plausibility=[r.to_dict() for r in plaus])
    if getattr(run.ctx, "reviewer", None) is not None:  # R4 curation seam (engine/review.py), after validation
        from ..review import curate_in_run

        curate_in_run(run, status)
    run.trace.emit("case_finished", message=f"status={status}" + (
        f" sr={sr} sr_delivered={sr_delivered} tcr={tcr:.3f}" if sr is not None else ""),
                   error_code=(st.error or {}).get("code"))
    if status == "succeeded" and st.ctx.audit:  # lean: the cohort writes _DONE with the case's row
        out.write_done(st.ctx.output_dir, {"run_id": st.ctx.run_id, "case": st.case.id, "sr": sr, "tcr": tcr,
                                           "deliverables": sorted(st.written)})
    return outcome


__all__ = ["finish_case"]
