"""Seams of the other workstreams on the whole-DAG engine: R4 review of report deliverables
(never bypassed by fusion), a missing input halting the case before any node runs (fused or
not), and the node clock keeping the driver's backstop from cancelling a node still queued."""
from __future__ import annotations

import importlib
import uuid
from pathlib import Path

import numpy as np
import pytest

from bcer.contracts import Case, Image, PlanSketch, Report, SequenceRef
from bcer.engine.compiler import compile_plan
from bcer.engine.executor import RunContext, run_case_workflow, run_case_workflows
from bcer.engine.review import ReviewResult
from bcer.engine.trace import read_case_trace
from bcer.io import write_nifti

importlib.import_module("tests.engine._seam_tools")

pytestmark = pytest.mark.timeout(120)


def make_case(root: Path, case_id: str, value: float = 2.0, missing: tuple[str, ...] = ()) -> Case:
    root.mkdir(parents=True, exist_ok=True)
    seqs = {}
    for name in ("T1", "T2"):
        path = root / f"{case_id}_{name}.nii.gz"
        if name not in missing:
            write_nifti(Image(np.full((6, 6, 4), value, np.float32), np.eye(4)), path)
        seqs[name] = SequenceRef(path=str(path))
    return Case(id=case_id, root=str(root), sequences=seqs)


class Upper:
    """A reviewer that rewrites the report (upper case) and remembers what it curated."""

    def __init__(self) -> None:
        self.curated: list[tuple[str, bool, str]] = []

    def review(self, request):
        r = request.report
        assert request.inputs["img"].data.shape == (6, 6, 4)  # the report node's input, from the object store
        return ReviewResult(Report(r.text.upper() + " (reviewed)", dict(r.structured, reviewed=True), r.evidence,
                                   dict(r.meta)), [{"kind": "r4_reflect", "message": "0 material issues"}])

    def curate(self, request):
        self.curated.append((request.case_id, request.verified, request.report.text))
        return {"action": "added", "reason": "test"}


def test_report_is_reviewed_by_the_driver_even_when_fusion_is_forced(ray_local, tmp_path):
    plan = PlanSketch(goal="t", steps=[{"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 1}},
                                       {"id": "note", "tool": "xseam.note", "args": {"img": "@node.a.image"}}])
    reviewer, run_id = Upper(), "rv-" + uuid.uuid4().hex[:6]
    items = []
    for i in range(3):
        case = make_case(tmp_path / "in", f"r{i}", value=float(i))
        items.append((compile_plan(plan, case), case,
                      RunContext(run_id=run_id, output_dir=tmp_path / "out" / case.id, reviewer=reviewer)))
    outcomes = run_case_workflows(items, reflector=False, fuse=True)
    assert [o.status for o in outcomes] == ["succeeded"] * 3, [o.error for o in outcomes]
    for i, (_, case, ctx) in enumerate(items):
        assert (ctx.output_dir / "note.md").read_text() == f"MEAN INTENSITY {i + 1.0:.1f} (reviewed)"
        kinds = [(e.kind, e.node) for e in read_case_trace(ctx.output_dir)]
        assert ("r4_reflect", "note") in kinds and ("deliverable", "note") in kinds
        assert kinds.index(("r4_reflect", "note")) < kinds.index(("deliverable", "note")) < kinds.index(
            ("case_finished", None))
    assert sorted(reviewer.curated) == [(f"r{i}", True, f"MEAN INTENSITY {i + 1.0:.1f} (reviewed)") for i in range(3)]


@pytest.mark.parametrize("fuse", [False, True])
def test_missing_input_halts_the_case_before_any_node_runs(ray_local, tmp_path, fuse):
    plan = PlanSketch(goal="t", steps=[{"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
                                       {"id": "j", "tool": "xtoy.join", "args": {"a": "@node.a.image", "b": "@seq.T2"}}])
    case = make_case(tmp_path / "in", "m1", missing=("T2",))
    ctx = RunContext(run_id="mh-" + uuid.uuid4().hex[:6], output_dir=tmp_path / "out" / case.id)
    [out] = run_case_workflows([(compile_plan(plan, case), case, ctx)], reflector=False, fuse=fuse)
    assert out.status == "halted" and out.error["code"] == "input_missing" and out.error["node"] == "seq.T2"
    assert out.node_status == {"a": "blocked", "j": "blocked"}
    events = read_case_trace(ctx.output_dir)
    assert not [e for e in events if e.kind in ("started", "succeeded", "deliverable")]
    assert not (ctx.output_dir / "_DONE").exists() and not (ctx.output_dir / "j.nii.gz").exists()


def test_backstop_never_cancels_a_node_still_queued(ray_local, tmp_path, monkeypatch):
    import bcer.engine.case.run as caserun

    # six 1-CPU branches of 1.8 s on 2 CPUs run in three waves; the third waits ~3.6 s for a worker,
    # past the backstop (limit 2 s + max(grace, limit)), but each RUNS within its limit
    monkeypatch.setattr(caserun, "_BACKSTOP_GRACE_S", 0.5)
    seen: list[dict[str, bool]] = []
    ran_past = caserun.CaseRun.ran_past

    def spy(self, keys, limits):
        got = ran_past(self, keys, limits)
        seen.append(got)
        return got

    monkeypatch.setattr(caserun.CaseRun, "ran_past", spy)
    plan = PlanSketch(goal="t", steps=[{"id": f"h{i}", "tool": "xseam.hog",
                                        "args": {"img": "@seq.T1", "add": i, "sleep_s": 1.8}} for i in range(6)])
    case = make_case(tmp_path / "in", "q1")
    ctx = RunContext(run_id="ck-" + uuid.uuid4().hex[:6], output_dir=tmp_path / "out" / case.id, node_timeout_s=2.0)
    out = run_case_workflow(compile_plan(plan, case), case, ctx, reflector=False)
    assert out.status == "succeeded", out.error
    events = read_case_trace(ctx.output_dir)
    assert not [e for e in events if e.kind in ("timeout", "retried", "failed")]
    assert any(v is False for got in seen for v in got.values())  # the clock saw a late node still queued
