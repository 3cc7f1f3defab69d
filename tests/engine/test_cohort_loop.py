"""The cohort loop: plan reuse, planners that trace, any exception is a row, incremental tables."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bcer.contracts import Case, Image, PlanSketch, SequenceRef
from bcer.engine.cohort import CohortConfig, default_in_flight, run_cohort
from bcer.engine.planning import StaticPlanner
from bcer.engine.tables import CohortTables
from bcer.engine.trace import read_case_trace
from bcer.io import write_nifti


pytestmark = pytest.mark.timeout(150)
PLAN = PlanSketch(goal="two steps", steps=[
    {"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
    {"id": "b", "tool": "xtoy.measure", "args": {"img": "@node.a.image"}}])


def make_cases(root: Path, n: int) -> list[Case]:
    out = []
    for i in range(n):
        p = write_nifti(Image(np.full((4, 4, 3), float(i), np.float32), np.eye(4)), root / f"q{i}" / "t1.nii.gz")
        out.append(Case(id=f"q{i}", root=str(p.parent), sequences={"T1": SequenceRef(path=str(p))}))
    return out


class CountingPlanner(StaticPlanner):
    """Deterministic: the runner may reuse its plan."""

    name = "counting"

    def __init__(self, sketch: PlanSketch):
        super().__init__(sketch)
        self.calls = 0

    def plan(self, goal, case, contract=None):
        self.calls += 1
        return super().plan(goal, case, contract)


class ChattyPlanner:
    """Not deterministic (an LLM planner's shape): asked per case, records its calls in the trace;
    it crashes (not a ToolError) on the case named ``q1``."""

    name = "chatty"

    def __init__(self):
        self.calls = 0

    def plan(self, goal, case, contract=None, *, emit=None):
        self.calls += 1
        emit("llm_call", message="asked the model", data={"backend": "fake", "prompt_tokens": 12})
        if case.id == "q1":
            raise KeyError("the model answered nothing usable")
        return PLAN.model_copy(deep=True)

    def revise(self, sketch, errors, case, contract=None, *, emit=None):
        return None


def test_deterministic_plan_is_reused_and_traced_per_case(ray_local, tmp_path):
    planner = CountingPlanner(PLAN)
    result = run_cohort(make_cases(tmp_path / "in", 3), CohortConfig(out=tmp_path / "out", planner=planner,
                                                                       audit=True))
    assert [r["status"] for r in result.rows] == ["succeeded"] * 3
    assert planner.calls == 1  # planned and compiled once for three cases of one signature
    for i, row in enumerate(result.rows):
        evs = read_case_trace(tmp_path / "out" / row["case"])
        kinds = [e.kind for e in evs]
        assert kinds[:3] == ["case_started", "planned", "compiled"] and kinds[-1] == "case_finished"
        assert next(e for e in evs if e.kind == "planned").data["reused"] is (i > 0)
        wf = json.loads((tmp_path / "out" / row["case"] / "workflow.json").read_text())
        assert wf["case_id"] == row["case"]  # the shared plan is recorded as this case's own
        assert row["measurements"]["b.all.mean"] == pytest.approx(i + 1.0)
        assert (tmp_path / "out" / row["case"] / "_DONE").exists()


def test_llm_like_planner_per_case_and_any_exception_is_a_row(ray_local, tmp_path, monkeypatch):
    import bcer.engine.case.finish as finish

    planner = ChattyPlanner()
    real = finish.finish_case

    def flaky_finish(run, cls):  # an engine bug that hits one case only
        if run.case.id == "q2":
            raise ZeroDivisionError("bug in the engine")
        return real(run, cls)

    monkeypatch.setattr(finish, "finish_case", flaky_finish)
    result = run_cohort(make_cases(tmp_path / "in", 4), CohortConfig(out=tmp_path / "out", planner=planner))
    rows = {r["case"]: r for r in result.rows}
    assert planner.calls == 4  # no reuse without ``deterministic``
    assert rows["q0"]["status"] == rows["q3"]["status"] == "succeeded"
    assert (rows["q1"]["status"], rows["q1"]["error_code"]) == ("failed", "internal")
    assert "KeyError" in rows["q1"]["error_message"]
    assert (rows["q2"]["status"], rows["q2"]["error_code"]) == ("failed", "internal")
    for cid, needle in (("q1", "KeyError"), ("q2", "ZeroDivisionError")):
        evs = read_case_trace(tmp_path / "out" / cid)
        assert evs[-1].kind == "case_finished" and needle in evs[-1].data["traceback"]
        assert not (tmp_path / "out" / cid / "_DONE").exists()
    calls = [e for e in result.events.to_pylist() if e["kind"] == "llm_call"]
    assert sorted(e["case"] for e in calls) == ["q0", "q1", "q2", "q3"]
    assert json.loads(calls[0]["data"])["prompt_tokens"] == 12
    assert pq.read_table(tmp_path / "out" / "cohort.parquet").num_rows == 4


def test_tables_consolidate_parts_of_a_killed_run(tmp_path):
    out = tmp_path / "cohort"
    (out / "c0").mkdir(parents=True)

    def lines(case: str, run: str, n: int) -> list[str]:
        return [json.dumps({"time": float(i), "run": run, "case": case, "kind": "started", "node": f"n{i}"})
                for i in range(n)]

    # an earlier complete run wrote events.parquet with c0 and c1
    old = CohortTables(out, "r0")
    old.add({"case": "c0", "status": "succeeded"}, lines("c0", "r0", 2))
    old.add({"case": "c1", "status": "failed"}, lines("c1", "r0", 1))
    old.finalize([{"case": "c0"}, {"case": "c1"}], ["c0", "c1"])
    # a second run was SIGKILLed: it left parts (c1 rerun: its whole trace, both runs; c2)
    killed = CohortTables(out, "r1", max_events=1)
    killed.add({"case": "c1", "status": "succeeded"}, lines("c1", "r0", 1) + lines("c1", "r1", 3))
    killed.add({"case": "c2", "status": "succeeded"}, lines("c2", "r1", 2))
    assert len(list((out / ".bcer_parts").glob("*.events.parquet"))) == 2
    # a third run resumes c0-c2 and runs c3; c4 was resumed but no table ever saw it
    (out / "c4").mkdir()
    (out / "c4" / "events.jsonl").write_text("\n".join(lines("c4", "r9", 2)) + "\n")
    now = CohortTables(out, "r2")
    now.add({"case": "c3", "status": "succeeded", "measurements": {"x": 1.5}}, lines("c3", "r2", 1))
    rows = [{"case": c, "status": "succeeded"} for c in ("c0", "c1", "c2")] + [
        {"case": "c3", "status": "succeeded", "measurements": {"x": 1.5}}, {"case": "c4", "status": "succeeded"}]
    now.finalize(rows, ["c0", "c1", "c2", "c3", "c4"])
    ev = pq.read_table(out / "events.parquet").to_pylist()
    per_case = {c: sorted((e["run"], e["node"]) for e in ev if e["case"] == c) for c in ("c0", "c1", "c2", "c3", "c4")}
    assert per_case["c0"] == [("r0", "n0"), ("r0", "n1")]  # from the old table
    assert per_case["c1"] == [("r0", "n0"), ("r1", "n0"), ("r1", "n1"), ("r1", "n2")]  # newest copy, no duplicates
    assert len(per_case["c2"]) == 2 and len(per_case["c3"]) == 1 and len(per_case["c4"]) == 2
    cohort = pq.read_table(out / "cohort.parquet")
    assert cohort.num_rows == 5 and cohort.column("m_x").to_pylist() == [None, None, None, 1.5, None]
    assert not (out / ".bcer_parts").exists()


def test_default_in_flight_follows_the_cluster():
    assert default_in_flight({"CPU": 2.0}) == 16
    assert default_in_flight({"CPU": 64.0, "GPU": 8.0}) == 544
    assert isinstance(pa.table({"a": [1]}), pa.Table)


def test_cases_known_to_be_long_are_started_first(ray_local, tmp_path, monkeypatch):
    """Longest expected case first (LPT) within one admission: the second cohort's case has the
    longer chain by the tool times this driver has seen, so it is started (submitted) first."""
    from collections import deque

    from bcer.engine import driver, segments
    from bcer.engine.cohort import run_cohorts
    from bcer.tools.registry import get_tool

    short = PlanSketch(goal="one step", steps=[{"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}}])
    started: list[str] = []
    real = driver.Driver._start

    def spy(self, job, case, trace, t0, planned):
        started.append(f"{job.cfg.out.name}/{case.id}")
        return real(self, job, case, trace, t0, planned)

    monkeypatch.setattr(driver.Driver, "_start", spy)
    seen = {("xtoy.step", get_tool("xtoy.step").spec.version): 0.01,
            ("xtoy.measure", get_tool("xtoy.measure").spec.version): 3.0}
    for k, s in seen.items():  # the autouse fixture clears the cost model after the test
        segments._SEEN[k] = deque([s] * 3, maxlen=9)
    results = run_cohorts([(make_cases(tmp_path / "in1", 1), CohortConfig(out=tmp_path / "short",
                                                                          planner=StaticPlanner(short))),
                           (make_cases(tmp_path / "in2", 1), CohortConfig(out=tmp_path / "long",
                                                                          planner=StaticPlanner(PLAN)))])
    assert started == ["long/q0", "short/q0"]
    assert [r.rows[0]["status"] for r in results] == ["succeeded", "succeeded"]


class _Owner:
    def __init__(self) -> None:
        self.got: list[tuple[tuple, object]] = []

    def dispatch(self, tag, value, exc) -> None:
        self.got.append((tag, value))

    def crash(self, exc) -> None:  # pragma: no cover - the handler above never raises
        raise exc

    def order(self, tag) -> int:
        return 0


def test_one_poll_serves_many_ready_refs_and_a_lone_ref_is_taken_at_once(ray_local):
    import ray

    from bcer.engine.loop import EventLoop

    loop, owner = EventLoop(), _Owner()
    refs = [ray.put(i) for i in range(16)]
    ray.wait(refs, num_returns=len(refs))  # all ready before the first poll
    for i, ref in enumerate(refs):
        loop.watch(ref, owner, ("n", i))
    polls = 0
    while len(loop):
        polls += 1
        assert loop.poll(5.0) >= 1
    assert sorted(v for _, v in owner.got) == list(range(16))
    assert polls <= 2  # 16 ready refs: every ready one is taken, not one per poll
    lone = ray.put("x")
    loop.watch(lone, owner, ("lone",))
    assert loop.poll(5.0) == 1 and owner.got[-1] == (("lone",), "x")
