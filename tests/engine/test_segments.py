"""Segment fusion (``engine.segments``): linear chains run as one task, and nothing else changes:
per-node events and provenance, local repair of only the failed node and its descendants,
the node cache, time limits, and a segment Ray gives up on reruns node by node."""
from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import numpy as np
import pytest

from bcer.contracts import PlanSketch
from bcer.engine.compiler import compile_plan
from bcer.engine.executor import RunContext, run_case_workflow, run_case_workflows
from bcer.engine.trace import read_case_trace
from bcer.io import read_nifti

from tests.engine.test_wholedag import branchy, killed_and_clean, make_case, tallies  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def chain_plan(n: int = 4, add_last: float = 1.0) -> PlanSketch:
    """s0 -> s1 -> ... -> s(n-1) (each +1, the last +add_last), then m measures the last one."""
    steps = [{"id": "s0", "tool": "xtoy.step", "args": {"img": "@seq.T1"}}]
    for k in range(1, n):
        steps.append({"id": f"s{k}", "tool": "xtoy.step",
                      "args": {"img": f"@node.s{k - 1}.image", "add": add_last if k == n - 1 else 1.0}})
    steps.append({"id": "m", "tool": "xtoy.measure", "args": {"img": f"@node.s{n - 1}.image"}})
    return PlanSketch(goal="t", steps=steps)


def _norm(evs: list) -> list[tuple]:
    """What a trace says, without times and workers."""
    return [(e.kind, e.node, e.tool, e.attempt, e.error_code) for e in evs]


def test_chains_are_segments_and_branches_stay_separate(case_run, tmp_path):
    """branchy: a -> {b -> c -> d, e}: a has two children and e is a leaf, so b..d is the one
    segment; the DAG is still handed to Ray at once (one load, a, the segment, e)."""
    from bcer.agents.repair.reflector import Reflector

    case = make_case(tmp_path / "in")
    run, driver, trace, ctx = case_run(branchy(), case, tmp_path / "out", "seg-" + uuid.uuid4().hex[:6], Reflector())
    run.start(segments=True)
    assert run.state.node_status() == {n: "running" for n in "abcde"}
    assert [[n for n, _ in s["nodes"]] for s in run.state.segments.values()] == [["b", "c", "d"]]
    assert len(driver.loop) == 4
    driver.add(run)
    driver.run()
    trace.close()
    assert run.outcome.status == "succeeded", run.outcome.error
    # b failed twice (window 40, 20): each time c and d did not run and were resubmitted with b
    assert {n: s.gen for n, s in run.state.nodes.items()} == {"a": 1, "b": 3, "c": 3, "d": 3, "e": 1}
    assert tallies(ctx.output_dir) == {"a": 1, "c": 1, "d": 1, "e": 1}
    np.testing.assert_allclose(read_nifti(ctx.output_dir / "d.nii.gz").data, (2.0 + 1) * 2 + 2)
    evs = read_case_trace(ctx.output_dir)
    assert Counter(e.node for e in evs if e.kind == "started") == {"a": 1, "b": 3, "c": 1, "d": 1, "e": 1}
    # the repaired b ran with c and d in one task (one worker), a and e on their own
    ran = {e.node: e.worker for e in evs if e.kind == "succeeded"}
    assert ran["b"] == ran["c"] == ran["d"]


def test_repair_inside_a_segment_keeps_the_upstream_results(ray_local, tmp_path):
    """s0 -> b (fails until repaired) -> s2 is one segment; the repair resubmits b and s2 bound
    to s0's kept ObjectRef: s0 runs once."""
    from bcer.agents.repair.reflector import Reflector

    case = make_case(tmp_path / "in", "rs")
    scratch = "@runtime.output_dir"
    plan = PlanSketch(goal="t", steps=[
        {"id": "s0", "tool": "xtoy.tally", "args": {"img": "@seq.T1", "tag": "s0", "scratch_dir": scratch}},
        {"id": "b", "tool": "xtoy.window", "args": {"img": "@node.s0.image", "window": 40}},
        {"id": "s2", "tool": "xtoy.tally", "args": {"img": "@node.b.image", "tag": "s2", "scratch_dir": scratch}}])
    ctx = RunContext(run_id="rs", output_dir=tmp_path / "o" / case.id)
    out = run_case_workflow(compile_plan(plan, case), case, ctx, reflector=Reflector())
    assert out.status == "succeeded", out.error
    assert tallies(ctx.output_dir) == {"s0": 1, "s2": 1}
    evs = read_case_trace(ctx.output_dir)
    assert Counter(e.node for e in evs if e.kind == "started") == {"s0": 1, "b": 3, "s2": 1}
    assert [e.patch["params"]["window"] for e in evs if e.kind == "repaired"] == [20, 10]
    np.testing.assert_allclose(read_nifti(ctx.output_dir / "s2.nii.gz").data, (2.0 + 1) * 2 + 1)


def test_segment_events_and_provenance_match_one_task_per_node(ray_local, tmp_path):
    case = make_case(tmp_path / "in", "eq")
    traces, prov = {}, {}
    for segments in (False, True):
        ctx = RunContext(run_id="eq", output_dir=tmp_path / f"o{segments}" / case.id)
        out = run_case_workflow(compile_plan(chain_plan(), case), case, ctx, segments=segments)
        assert out.status == "succeeded", out.error
        traces[segments] = _norm(read_case_trace(ctx.output_dir))
        prov[segments] = json.loads((ctx.output_dir / "provenance.json").read_text())["deliverables"]["m"]
    assert traces[True] == traces[False]
    assert [k for k, *_ in traces[True]].count("started") == 5
    assert prov[True]["artifact_digest"] == prov[False]["artifact_digest"]
    keep = ("node", "tool", "params", "input_digests", "output_digests", "device", "attempt")
    assert ([{k: r.get(k) for k in keep} for r in prov[True]["chain"]]
            == [{k: r.get(k) for k in keep} for r in prov[False]["chain"]])


def test_segment_cache_hits_per_node_and_a_changed_node_reruns_alone(ray_local, tmp_path):
    case = make_case(tmp_path / "in", "ch")
    cache = tmp_path / "cache"

    def run(name: str, plan: PlanSketch) -> list:
        ctx = RunContext(run_id=name, output_dir=tmp_path / name / case.id, cache_dir=cache)
        out = run_case_workflow(compile_plan(plan, case), case, ctx)
        assert out.status == "succeeded", out.error
        return read_case_trace(ctx.output_dir)

    first = run("c1", chain_plan())
    assert sorted(e.node for e in first if e.kind == "cache_stored") == ["m", "s0", "s1", "s2", "s3"]
    again = run("c2", chain_plan())
    assert sorted(e.node for e in again if e.kind == "cache_hit") == ["m", "s0", "s1", "s2", "s3"]
    assert not [e for e in again if e.kind == "cache_stored"]
    changed = run("c3", chain_plan(add_last=4.0))
    assert sorted(e.node for e in changed if e.kind == "cache_hit") == ["s0", "s1", "s2"]
    assert sorted(e.node for e in changed if e.kind == "cache_stored") == ["m", "s3"]
    chains = {name: {r["node"]: r["output_digests"] for r in json.loads(
        (tmp_path / name / case.id / "provenance.json").read_text())["deliverables"]["m"]["chain"]}
        for name in ("c1", "c3")}
    assert chains["c3"]["s2"] == chains["c1"]["s2"] and chains["c3"]["s3"] != chains["c1"]["s3"]


def test_a_segment_ray_gives_up_on_reruns_node_by_node(ray_local, tmp_path):
    """The segment's worker is SIGKILLed (no Ray retry allowed): its nodes rerun one task each
    and the deliverables equal a clean run's."""
    out, ref, killed, clean = killed_and_clean(tmp_path, "sk")
    assert out.status == ref.status == "succeeded", (out.error, ref.error)
    evs = read_case_trace(killed.output_dir)
    assert any(e.kind == "retried" and e.error_code == "worker_lost" and "segment" in e.message for e in evs)
    assert (killed.output_dir / "killed_once").read_text().isdigit()  # the segment's worker really died
    ran = {e.node: e.worker for e in evs if e.kind == "succeeded"}
    assert len(set(ran.values())) >= 1 and set(ran) == {"a", "k", "m"}
    files = [json.loads((c.output_dir / "provenance.json").read_text())["deliverables"]["m"]["files"]
             for c in (killed, clean)]
    assert files[0] == files[1]


def test_a_time_limit_inside_a_segment_is_the_nodes_own(ray_local, tmp_path):
    """a -> z (xtoy.sleepy: 1-s limit of its own) -> m: z times out twice (re-submitted unchanged
    once), exactly as one task per node; a ran once."""
    case = make_case(tmp_path / "in", "tl")
    plan = PlanSketch(goal="t", steps=[
        {"id": "a", "tool": "xtoy.tally", "args": {"img": "@seq.T1", "tag": "a", "scratch_dir": "@runtime.output_dir"}},
        {"id": "z", "tool": "xtoy.sleepy", "args": {"img": "@node.a.image", "sleep_s": 30}},
        {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.z.image"}}])
    ctx = RunContext(run_id="tl", output_dir=tmp_path / "o" / case.id)
    out = run_case_workflow(compile_plan(plan, case), case, ctx, reflector=False)
    assert out.status == "failed" and out.error["code"] == "timeout" and out.error["node"] == "z"
    evs = read_case_trace(ctx.output_dir)
    assert [e.data["limit_s"] for e in evs if e.kind == "timeout"] == [1.0, 1.0]
    assert [e.message for e in evs if e.kind == "retried"] == ["timed out: re-submitted unchanged"]
    assert tallies(ctx.output_dir) == {"a": 1}
    assert out.node_status["m"] == "blocked"


def test_a_fan_out_of_known_tiny_nodes_joins_its_parents_segment(case_run, tmp_path):
    """a -> {b, c, d}: separate tasks while the driver has not seen the tool run; one task once
    it has seen it run fast (three runs); still after one slow run, not once most recent runs are slow."""
    from bcer.engine import segments

    case = make_case(tmp_path / "in", "ft")
    plan = PlanSketch(goal="t", steps=[{"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}}] + [
        {"id": k, "tool": "xtoy.step", "args": {"img": "@node.a.image", "add": float(i)}}
        for i, k in enumerate("bcd")])

    def run(name: str) -> tuple[list, Any]:
        r, driver, trace, ctx = case_run(plan, case, tmp_path / name, name)
        r.start()
        segs = [[n for n, _ in s["nodes"]] for s in r.state.segments.values()]
        driver.add(r)
        driver.run()
        trace.close()
        assert r.outcome.status == "succeeded", r.outcome.error
        return segs, read_case_trace(ctx.output_dir)

    first, ev1 = run("t1")
    assert first == []  # a has three children and the tool is unknown: four tasks
    assert len(segments._SEEN[("xtoy.step", "1.0")]) == 4  # the driver saw the four runs
    segments._SEEN.clear()  # how fast they were depends on the machine's load: set it
    for _ in range(3):
        segments.observe("xtoy.step", "1.0", 0.0003)
    assert segments.is_tiny(compile_plan(plan, case).node("b"))
    second, ev2 = run("t2")
    assert second == [["a", "b", "c", "d"]]
    # the same events either way (siblings' results arrive in any order as separate tasks)
    assert sorted(_norm(ev1), key=str) == sorted(_norm(ev2), key=str)
    assert all([x for x in _norm(ev1) if x[1] == n] == [x for x in _norm(ev2) if x[1] == n] for n in "abcd")
    assert len({e.worker for e in ev2 if e.kind == "succeeded"}) == 1
    segments._SEEN.clear()  # t2's own runs count too, and under load a no-op can take > 2 ms: set it again
    for _ in range(3):
        segments.observe("xtoy.step", "1.0", 0.0003)
    segments.observe("xtoy.step", "1.0", 0.5)  # one slow run (a preempted worker): still tiny
    assert segments.is_tiny(compile_plan(plan, case).node("b"))
    for _ in range(segments._RECENT // 2):  # the tool really is slow now: most of the window, not tiny
        segments.observe("xtoy.step", "1.0", 0.5)
    third, _ = run("t3")
    assert third == []


def test_a_slow_node_never_joins_once_the_segment_branches(case_run, tmp_path):
    """a -> {b, c}, b -> b2, with xtoy.step known tiny and xtoy.tally unknown: b joins a (tiny),
    c does not (unknown, a sibling), and b2 neither, though b's only child: c's consumers would
    wait for it. Only the segment [a, b]."""
    from bcer.engine import segments

    for _ in range(3):
        segments.observe("xtoy.step", "1.0", 0.0002)
    case = make_case(tmp_path / "in", "sb")
    scratch = "@runtime.output_dir"
    plan = PlanSketch(goal="t", steps=[
        {"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
        {"id": "b", "tool": "xtoy.step", "args": {"img": "@node.a.image"}},
        {"id": "c", "tool": "xtoy.tally", "args": {"img": "@node.a.image", "tag": "c", "scratch_dir": scratch}},
        {"id": "b2", "tool": "xtoy.tally", "args": {"img": "@node.b.image", "tag": "b2", "scratch_dir": scratch}}])
    run, driver, trace, ctx = case_run(plan, case, tmp_path / "o", "sb")
    run.start()
    assert [[n for n, _ in s["nodes"]] for s in run.state.segments.values()] == [["a", "b"]]
    driver.add(run)
    driver.run()
    trace.close()
    assert run.outcome.status == "succeeded", run.outcome.error
    assert tallies(ctx.output_dir) == {"c": 1, "b2": 1}


def test_critical_path_is_the_longest_chain_of_seen_tool_times() -> None:
    from collections import deque

    from bcer.contracts.workflow import Node, Workflow
    from bcer.engine import segments

    nodes = [Node(id="a", tool="cp.a", inputs={}), Node(id="b", tool="cp.b", inputs={"x": "@node.a.out"}),
             Node(id="c", tool="cp.c", inputs={"x": "@node.a.out"}),
             Node(id="d", tool="cp.d", inputs={"x": "@node.b.out", "y": "@node.c.out"})]
    wf = Workflow(case_id="c", goal="cp", nodes=nodes, edges=[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert segments.critical_path_s(wf) == 0.0  # nothing seen yet: no order is imposed
    for tool, s in {"cp.a": 1.0, "cp.b": 5.0, "cp.c": 2.0, "cp.d": 0.5}.items():  # cleared by the autouse fixture
        segments._SEEN[(tool, "1.0")] = deque([s, s, 100.0 * s, s], maxlen=9)  # the median, not the outlier
    assert segments.expected_s("cp.b", "1.0") == 5.0
    assert segments.critical_path_s(wf) == pytest.approx(1.0 + 5.0 + 0.5)  # a -> b -> d, not a -> c -> d
