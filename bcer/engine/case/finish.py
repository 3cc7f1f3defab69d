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
    if run.contract is None:  # no contract: SR = every required node ran, TCR = the fraction that did
        required = [n.id for n in run.wf.nodes if n.required]
        done = sum(run.status.get(n) == "succeeded" for n in required)
        ok = run.error is None and done == len(required)
        return {}, int(ok), (done / len(required) if required else 1.0)
    checks = validate_deliverables(run.contract, run.ctx.output_dir, run.case)
    for name, (ok, why) in checks.items():
        run.trace.emit("validated", node=run.written.get(name, {}).get("node"), message=f"{name}: {why}",
                       error_code=None if ok else ErrorCode.schema.value)
    sr, tcr = score(run.contract, run.milestones, checks)
    if run.error is None and not sr:
        bad = next((n for n, (ok, _) in checks.items() if not ok), None)
        missing = [m for m in run.contract.milestones if m not in run.milestones]
        msg = (f"deliverable {bad!r} failed validation: {checks[bad][1]}" if bad
               else f"milestones not reached: {missing}")
        run.error = {"code": ErrorCode.schema.value, "message": msg, "node": None, "tool": None}
    return checks, sr, tcr


def _plausibility(run: Any, checks: dict[str, tuple[bool, str]]) -> list[CheckResult]:
    """The contract's plausibility checks over the written deliverables, one event each."""
    if run.contract is None or not run.contract.plausibility:
        return []
    results = run_checks(run.contract, run.case, run.ctx.output_dir, checks, loaded=run.loaded_sequence)
    for r in results:
        run.trace.emit("plausibility", node=run.written.get(r.deliverable, {}).get("node"),
                       message=f"{r.check} on {r.deliverable}: {r.message}", data=r.to_dict(),
                       error_code=ErrorCode.value_range.value if r.ok is False else None)
    return results


def _implausible_error(run: Any, results: list[CheckResult]) -> dict[str, Any]:
    first = failed(results)[0]
    node = run.written.get(first.deliverable, {}).get("node")
    tool = next((n.tool for n in run.wf.nodes if n.id == node), None)
    return {"code": ErrorCode.value_range.value, "message": summary_message(results), "node": node, "tool": tool,
            "check": first.check, "value": first.value, "limit": first.limit}


def finish_case(run: Any, outcome_cls: type) -> Any:
    """Validate, check plausibility, score, write ``workflow.json`` and ``provenance.json``;
    ``_DONE`` last, only for a case whose contract validated and whose deliverables are
    plausible (without a contract: every required node succeeded, and SR/TCR count required
    nodes instead of milestones and deliverables)."""
    checks, sr, tcr = _validate(run)
    plaus = _plausibility(run, checks)
    status = "succeeded" if run.error is None else ("halted" if run.halted else "failed")
    sr_delivered = sr
    if failed(plaus):
        sr = 0
        if status == "succeeded":
            status, run.error = "implausible", _implausible_error(run, plaus)
    out.write_workflow(run.ctx.output_dir, run.wf)
    # kind and options too: with them the record alone re-reads the input exactly (e.g. k-space, not
    # the reconstruction stored beside it in the same .h5)
    inputs = {k: {"path": str(run.case.sequences[k].path), "format": run.case.sequences[k].format,
                  "kind": run.case.sequences[k].kind.value, "options": run.case.sequences[k].options or None,
                  "sha256": m.get("sha256"), "frames": m.get("frames") or None}
              for k, m in run.seq_meta.items() if m.get("ok")}
    prov = out.build_provenance(run.wf, run.records, run.written, inputs, run.ctx.run_id)
    if plaus:
        prov["plausibility"] = [r.to_dict() for r in plaus]
    out.write_provenance(run.ctx.output_dir, prov)
    outcome = outcome_cls(
        case_id=run.case.id, status=status, error=run.error, deliverables=run.deliverable_paths(),
        node_status=dict(run.status), milestones_done=list(run.milestones), measurements=dict(run.measurements),
        measurement_rows=out.case_records(run.written), repairs=run.repairs, sr=sr, tcr=tcr, validations=checks, workflow=run.wf,
        sr_delivered=sr_delivered, plausibility=[r.to_dict() for r in plaus])
    if getattr(run.ctx, "reviewer", None) is not None:  # R4 curation seam (engine/review.py), after validation
        from ..review import curate_in_run

        curate_in_run(run, status)
    run.trace.emit("case_finished", message=f"status={status}" + (
        f" sr={sr} sr_delivered={sr_delivered} tcr={tcr:.3f}" if sr is not None else ""),
                   error_code=(run.error or {}).get("code"))
    if status == "succeeded":
        out.write_done(run.ctx.output_dir, {"run_id": run.ctx.run_id, "case": run.case.id, "sr": sr, "tcr": tcr,
                                            "deliverables": sorted(run.written)})
    return outcome


__all__ = ["finish_case"]
