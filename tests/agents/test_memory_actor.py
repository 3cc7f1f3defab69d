"""The memory actor on Ray: a killed actor restarts with every acknowledged exemplar; a cohort
with R4 curates verified reports, a restarted cohort (fresh actor, new or resumed output)
retrieves them and nothing is lost; --r4 off writes the tool's report untouched."""
from __future__ import annotations

import json
import time

import pytest

from bcer.agents.planners.offline import OfflinePlanner
from bcer.agents.memory_actor import MemoryClient, memory_actor
from bcer.agents.r4.reviewer import R4Reviewer
from bcer.bench.cases import synth_task_cases
from bcer.contracts import load_contract
from bcer.engine.cohort import CohortConfig, run_cohort
from bcer.engine.trace import read_case_trace
from bcer.memory import Exemplar, ExemplarMemory

pytestmark = pytest.mark.timeout(600)


def _events(case_dir, kind=None):
    """The case's events as dicts (its events.jsonl, or its rows of the cohort's events.parquet)."""
    return [e.model_dump() for e in read_case_trace(case_dir) if kind is None or e.kind == kind]


def test_killed_actor_restarts_with_everything(ray_local, tmp_path):
    ray = ray_local
    handle = memory_actor(tmp_path / "mem", embedder="hash", name="test_mem_kill")
    client = MemoryClient(handle)
    for i in range(3):
        r = client.add(Exemplar(task="t", profile_text=f"finding {i} size {i * 17}", report_text=str(i),
                                case=f"c{i}", structure=str(i)).to_dict())
        assert r["action"] == "added"
    pid = ray.get(handle.pid.remote())
    ray.kill(handle, no_restart=False)  # Ray restarts it (max_restarts); the new one replays the WAL
    deadline = time.time() + 60
    while ray.get(handle.pid.remote()) == pid and time.time() < deadline:  # ray.kill is asynchronous
        time.sleep(0.2)
    assert ray.get(handle.pid.remote()) != pid
    stats = client.stats()
    assert stats["exemplars"] == 3 and stats["replayed"] == 3
    assert client.search("t", "finding 1 size 17", 1)[0]["record"]["case"] == "c1"
    again = client.add(Exemplar(task="t", profile_text="finding 1 size 17", report_text="1", case="c1",
                                structure="1").to_dict())
    assert again["action"] == "exists"  # a retried add is idempotent
    client.close()
    ray.kill(handle, no_restart=True)


def _gone(ray, name: str, within_s: float = 30.0) -> None:
    """A non-detached actor is collected once its last handle is released, which Ray does
    asynchronously: wait for it (bounded) instead of racing it."""
    import gc
    import time

    deadline = time.time() + within_s
    while time.time() < deadline:
        gc.collect()
        try:
            ray.get_actor(name)
        except ValueError:
            return
        time.sleep(0.2)
    pytest.fail(f"actor {name!r} outlived its cohort by {within_s} s")


def test_cohort_curates_and_a_restarted_cohort_retrieves(ray_local, tmp_path):
    ray = ray_local
    cases = synth_task_cases("cardiac_report", 2, tmp_path / "data", "small", seed=3)
    contract, mem_dir = load_contract("cardiac_report"), tmp_path / "mem"

    def cohort(out, name):
        reviewer = lambda: R4Reviewer(memory_actor(mem_dir, embedder="hash", name=name), own_memory=True)  # noqa: E731
        cfg = CohortConfig(out=out, planner=OfflinePlanner(), contract=contract, max_in_flight=2, reviewer=reviewer)
        return run_cohort(cases, cfg)

    first = cohort(tmp_path / "out1", "test_mem_cohort_a")
    assert all(r["status"] == "succeeded" for r in first.rows)
    for c in cases:
        d = tmp_path / "out1" / c.id
        report = json.loads((d / "report.json").read_text())
        assert report["meta"]["r4"]["material_issues"] == 0 and "## Findings" in report["text"]
        assert [e["data"]["action"] for e in _events(d, "memory_add")] == ["added"]
        assert {"r4_route", "r4_draft", "r4_reflect"} <= {e["kind"] for e in _events(d)}
    _gone(ray, "test_mem_cohort_a")  # the cohort's actor went with its cohort (closed: checkpointed)
    second = cohort(tmp_path / "out2", "test_mem_cohort_b")  # a fresh actor reloads the folder
    assert all(r["status"] == "succeeded" for r in second.rows)
    for c in cases:
        (ret,) = _events(tmp_path / "out2" / c.id, "r4_retrieve")
        assert ret["data"]["ids"], "nothing retrieved from the first cohort's memory"
        rep = json.loads((tmp_path / "out2" / c.id / "report.json").read_text())
        assert c.id not in rep["meta"]["r4"]["exemplars"]  # never its own earlier report
        # the same case gives the same report: already in memory, a rerun does not inflate support
        assert [e["data"]["action"] for e in _events(tmp_path / "out2" / c.id, "memory_add")] == ["exists"]
    resumed = cohort(tmp_path / "out1", "test_mem_cohort_b")  # resume: both cases skipped
    assert all(r.get("resumed") for r in resumed.rows)
    stats = ExemplarMemory(mem_dir, "hash", readonly=True).stats()
    assert stats["exemplars"] == 2 and stats["tasks"]["cardiac_report"]["support"] == 2
    assert stats["wal_pending"] == 0  # the closing cohort checkpointed


def test_report_reviewer_only_for_report_tasks():
    from bcer.api import report_reviewer

    assert report_reviewer(load_contract("segment_brain")) is None  # no report deliverable
    assert report_reviewer(load_contract("cardiac_report"), r4=False) is None
    assert report_reviewer(load_contract("cardiac_report"), r4="off") is None
    assert callable(report_reviewer(load_contract("cardiac_report"), memory="/tmp/x"))


def test_r4_off_keeps_the_tool_report(ray_local, tmp_path):
    from bcer.api import Study

    cases = synth_task_cases("cardiac_report", 1, tmp_path / "data", "small", seed=4)
    Study(cases, task="cardiac_report", out=tmp_path / "off", r4=False, max_in_flight=1).run()
    d = tmp_path / "off" / cases[0].id
    report = json.loads((d / "report.json").read_text())
    assert "r4" not in report["meta"] and not _events(d, "r4_route")
    assert "## Findings" in report["text"] and report["text"].count("## Measurements") == 1


def test_a_failing_reviewer_keeps_the_tool_report(ray_local, tmp_path):
    class Broken:
        def review(self, request):
            raise RuntimeError("reviewer down")

        def curate(self, request):
            raise RuntimeError("memory down")

    cases = synth_task_cases("cardiac_report", 1, tmp_path / "data", "small", seed=5)
    cfg = CohortConfig(out=tmp_path / "out", planner=OfflinePlanner(), contract=load_contract("cardiac_report"),
                       max_in_flight=1, reviewer=Broken())
    (row,) = run_cohort(cases, cfg).rows
    d = tmp_path / "out" / cases[0].id
    assert row["status"] == "succeeded" and (d / "_DONE").exists()
    report = json.loads((d / "report.json").read_text())
    assert "r4" not in report["meta"] and "## Findings" in report["text"]  # the tool's own report
    (err,) = _events(d, "r4_reflect")
    assert err["error_code"] == "internal" and "reviewer down" in err["message"]
