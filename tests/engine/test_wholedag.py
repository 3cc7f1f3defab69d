"""Whole-DAG submission, fusion, repair of only the failed node and its descendants, time limits."""
from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bcer.contracts import Case, Image, PlanSketch, SequenceRef
from bcer.engine.compiler import compile_plan
from bcer.engine.executor import RunContext, run_case_workflow, run_case_workflows
from bcer.engine.trace import read_case_trace
from bcer.io import read_nifti, write_nifti


pytestmark = pytest.mark.timeout(120)


def make_case(root: Path, case_id: str = "w1", value: float = 2.0) -> Case:
    root.mkdir(parents=True, exist_ok=True)
    path = write_nifti(Image(np.full((6, 6, 4), value, np.float32), np.eye(4)), root / f"{case_id}.nii.gz")
    return Case(id=case_id, root=str(root), sequences={"T1": SequenceRef(path=str(path))})


def branchy() -> PlanSketch:
    """a -> b (fails twice: window too large) -> c -> d, and a -> e (independent branch)."""
    scratch = "@runtime.output_dir"
    return PlanSketch(goal="test", steps=[
        {"id": "a", "tool": "xtoy.tally", "args": {"img": "@seq.T1", "tag": "a", "scratch_dir": scratch}},
        {"id": "b", "tool": "xtoy.window", "args": {"img": "@node.a.image", "window": 40}},
        {"id": "c", "tool": "xtoy.tally", "args": {"img": "@node.b.image", "tag": "c", "scratch_dir": scratch}},
        {"id": "d", "tool": "xtoy.tally", "args": {"img": "@node.c.image", "tag": "d", "scratch_dir": scratch}},
        {"id": "e", "tool": "xtoy.tally", "args": {"img": "@node.a.image", "tag": "e", "scratch_dir": scratch,
                                                  "sleep_s": 0.2}}])


def tallies(case_dir: Path) -> Counter:
    return Counter((case_dir / "tally.log").read_text().split())


def killed_and_clean(tmp_path: Path, case_id: str, **run_kw) -> tuple:
    """a -> k -> m where k SIGKILLs its worker once (no Ray retry allowed), and the same plan
    run clean (k's sentinel pre-made): ``(killed outcome, clean outcome, killed ctx, clean ctx)``."""
    case = make_case(tmp_path / "in", case_id)
    plan = PlanSketch(goal="t", steps=[
        {"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
        {"id": "k", "tool": "xtoy.suicide", "args": {"img": "@node.a.image", "scratch_dir": "@runtime.output_dir"}},
        {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.k.image"}}])
    killed = RunContext(run_id=f"{case_id}-k", output_dir=tmp_path / "k" / case.id, task_max_retries=0)
    clean = RunContext(run_id=f"{case_id}-c", output_dir=tmp_path / "c" / case.id)
    clean.output_dir.mkdir(parents=True)
    (clean.output_dir / "killed_once").write_text("pre-made: no kill in the clean run")
    (out,) = run_case_workflows([(compile_plan(plan, case), case, killed)], **run_kw)
    (ref,) = run_case_workflows([(compile_plan(plan, case), case, clean)], **run_kw)
    return out, ref, killed, clean


def test_whole_dag_is_submitted_at_once(case_run, tmp_path):
    from bcer.agents.repair.reflector import Reflector

    case = make_case(tmp_path / "in")
    run, driver, trace, ctx = case_run(branchy(), case, tmp_path / "out", "dag-" + uuid.uuid4().hex[:6], Reflector())
    run.start(segments=False)  # one task per node (segments: tests/engine/test_segments.py)
    # before any result is seen, every node is already in Ray: one meta per node + one load
    assert run.state.node_status() == {n: "running" for n in "abcde"}
    assert len(driver.loop) == 6
    driver.add(run)
    driver.run()
    trace.close()
    assert run.outcome.status == "succeeded", run.outcome.error
    # c and d were submitted three times (chained to b's failing attempts) and ran once
    assert {n: s.gen for n, s in run.state.nodes.items()} == {"a": 1, "b": 3, "c": 3, "d": 3, "e": 1}
    assert tallies(ctx.output_dir) == {"a": 1, "c": 1, "d": 1, "e": 1}
    got = read_nifti(ctx.output_dir / "d.nii.gz").data
    np.testing.assert_allclose(got, (2.0 + 1) * 2 + 2)  # a +1, b x2 (window 10), c +1, d +1


@pytest.mark.parametrize("fuse", [False, True])
def test_repair_reruns_only_the_failed_node_and_its_descendants(ray_local, tmp_path, fuse):
    from bcer.agents.repair.reflector import Reflector

    cases = [make_case(tmp_path / "in", f"r{i}", value=float(i)) for i in range(2)]
    run_id = "rep-" + uuid.uuid4().hex[:6]
    items = [(compile_plan(branchy(), c), c, RunContext(run_id=run_id, output_dir=tmp_path / "out" / c.id))
             for c in cases]
    outs = run_case_workflows(items, reflector=Reflector(), fuse=fuse)
    for case, out in zip(cases, outs):
        d = tmp_path / "out" / case.id
        assert out.status == "succeeded", out.error
        assert tallies(d) == {"a": 1, "c": 1, "d": 1, "e": 1}  # upstream a and branch e never re-ran
        evs = read_case_trace(d)
        started = Counter(e.node for e in evs if e.kind == "started")
        assert started == {"a": 1, "b": 3, "c": 1, "d": 1, "e": 1}
        assert [e.patch["params"]["window"] for e in evs if e.kind == "repaired"] == [20, 10]
        assert all(e.patch["tier"] == 1 for e in evs if e.kind == "repaired")
        np.testing.assert_allclose(read_nifti(d / "d.nii.gz").data, (case_value(case) + 1) * 2 + 2)
        np.testing.assert_allclose(read_nifti(d / "e.nii.gz").data, case_value(case) + 2)
        if fuse:  # one fused task ran a, b (failing), e; the repaired b and its descendants ran alone
            assert len({e.worker for e in evs if e.kind == "succeeded" and e.node in ("a", "e")}) == 1


def case_value(case: Case) -> float:
    return float(read_nifti(case.sequences["T1"].path).data.mean())


def test_fused_and_unfused_runs_give_identical_deliverables_and_provenance(ray_local, tmp_path):
    import json

    case = make_case(tmp_path / "in", "same")
    plan = PlanSketch(goal="t", steps=[
        {"id": "s", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 3}},
        {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.s.image"}},
        {"id": "g", "tool": "xtoy.grade", "args": {"table": "@node.m.table"}}])
    prov = {}
    for fuse in (False, True):
        ctx = RunContext(run_id="f", output_dir=tmp_path / f"out{fuse}" / case.id)
        (out,) = run_case_workflows([(compile_plan(plan, case), case, ctx)], fuse=fuse)
        assert out.status == "succeeded", out.error
        prov[fuse] = json.loads((ctx.output_dir / "provenance.json").read_text())["deliverables"]
    for name in ("g",):
        assert prov[True][name]["files"] == prov[False][name]["files"]
        assert prov[True][name]["artifact_digest"] == prov[False][name]["artifact_digest"]
        assert ([c["output_digests"] for c in prov[True][name]["chain"]]
                == [c["output_digests"] for c in prov[False][name]["chain"]])


def test_default_tool_time_limit_and_driver_backstop(ray_local, tmp_path, monkeypatch):
    import bcer.engine.case.run as caserun

    case = make_case(tmp_path / "in", "slow")
    # xtoy.sleepy's own Resources.timeout_s (1 s) stops its 30-s sleep: no --node-timeout given
    out = run_case_workflow(compile_plan(PlanSketch(goal="t", steps=[
        {"id": "z", "tool": "xtoy.sleepy", "args": {"img": "@seq.T1", "sleep_s": 30}}]), case),
        case, RunContext(run_id="tl", output_dir=tmp_path / "a" / case.id), reflector=False)
    assert out.status == "failed" and out.error["code"] == "timeout" and out.error["node"] == "z"
    # two 1-s attempts (a timed-out node is re-submitted unchanged once); without the limit the
    # node would have succeeded after its 30-s sleep: the failure itself shows the limit acted
    evs = read_case_trace(tmp_path / "a" / case.id)
    assert [e.data["limit_s"] for e in evs if e.kind == "timeout"] == [1.0, 1.0]
    assert [e.message for e in evs if e.kind == "retried"] == ["timed out: re-submitted unchanged"]
    # a tool deaf to the worker's alarm (SIGALRM blocked, as in a long C call) is cancelled by the driver
    monkeypatch.setattr(caserun, "_BACKSTOP_GRACE_S", 0.5)
    out = run_case_workflow(compile_plan(PlanSketch(goal="t", steps=[
        {"id": "st", "tool": "xtoy.stubborn", "args": {"img": "@seq.T1", "sleep_s": 20}}]), case),
        case, RunContext(run_id="bs", output_dir=tmp_path / "b" / case.id, node_timeout_s=1.0,
                         task_max_retries=0), reflector=False)
    assert out.status == "failed" and out.error["code"] == "timeout" and "cancelled" in out.error["message"]
    # without the backstop the deaf tool would have finished its sleep and succeeded


def test_task_names_are_readable():
    from bcer.engine.placement import Placement, task_name, task_options

    opts = task_options(task_name("sub01", "seg", "seg.brain_tumor"), Placement(1.0, 0.0, None, "cpu"), 3, 2)
    assert opts["name"] == "sub01/seg/seg.brain_tumor"
    assert (opts["num_returns"], opts["max_retries"], opts["retry_exceptions"]) == (3, 2, False)


def test_a_fused_task_ray_gives_up_on_reruns_node_by_node(ray_local, tmp_path):
    """The worker of a fused case is SIGKILLed (no Ray retry allowed): the case reruns unfused
    and ends with the deliverables of a clean run."""
    import json

    out, ref, killed, clean = killed_and_clean(tmp_path, "fk", fuse=True)
    assert out.status == ref.status == "succeeded", (out.error, ref.error)
    evs = read_case_trace(killed.output_dir)
    assert any(e.kind == "retried" and e.error_code == "worker_lost" and "fused" in e.message for e in evs)
    assert (killed.output_dir / "killed_once").read_text().isdigit()  # the fused worker really died
    digests = [json.loads((c.output_dir / "provenance.json").read_text())["deliverables"]["m"]["files"]
               for c in (killed, clean)]
    assert digests[0] == digests[1]
