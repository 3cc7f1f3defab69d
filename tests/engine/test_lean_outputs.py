"""What a cohort leaves in each case folder: lean by default (deliverables, provenance.json,
_DONE holding the row), the full audit for a case that did not succeed, and for every case
with ``audit=True``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bcer.contracts import Case, DeliverableSpec, Image, PlanSketch, SequenceRef, TaskContract, Validator
from bcer.engine.cohort import CohortConfig, run_cohort
from bcer.engine.planning import StaticPlanner
from bcer.engine.trace import read_case_trace
from bcer.io import write_nifti

pytestmark = pytest.mark.timeout(150)
PLAN = PlanSketch(goal="mean", steps=[{"id": "m", "tool": "xtoy.measure", "args": {"img": "@seq.T1"}}])
CONTRACT = TaskContract(id="lean_mean", domain="any", goal="mean", inputs=["T1"], milestones=["measured"],
                        deliverables=[DeliverableSpec(name="stats", kind="table", milestone="measured",
                                                      file="stats.json",
                                                      validators=[Validator(type="table_rows", arg=1)])])
AUDIT = {"events.jsonl", "plan.json", "workflow.json", "result.json"}


def _cases(root: Path) -> list[Case]:
    cases = []
    for i in range(3):
        p = write_nifti(Image(np.full((4, 4, 3), float(i + 1), np.float32), np.eye(4)), root / f"q{i}" / "t1.nii.gz")
        cases.append(Case(id=f"q{i}", root=str(p.parent), sequences={"T1": SequenceRef(path=str(p))}))
    (root / "q2" / "t1.nii.gz").write_bytes(b"not a nifti")  # q2 cannot be read: it fails
    return cases


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _run(cases: list[Case], out: Path, audit: bool):
    return run_cohort(cases, CohortConfig(out=out, planner=StaticPlanner(PLAN), contract=CONTRACT, audit=audit,
                                          derivatives=False))


def test_a_lean_case_keeps_three_files_and_a_failed_one_its_full_audit(ray_local, tmp_path):
    cases = _cases(tmp_path / "in")
    out = tmp_path / "out"
    result = _run(cases, out, audit=False)
    status = {r["case"]: r["status"] for r in result.rows}
    assert status["q0"] == status["q1"] == "succeeded" and status["q2"] != "succeeded"

    for cid, mean in (("q0", 1.0), ("q1", 2.0)):
        assert _files(out / cid) == {"stats.json", "provenance.json", "_DONE"}
        done = json.loads((out / cid / "_DONE").read_text())  # the row itself
        assert done["status"] == "succeeded" and done["measurements"]["stats.all.mean"] == pytest.approx(mean)
        prov = json.loads((out / cid / "provenance.json").read_text())
        assert prov["dag"]["nodes"] == [{"id": "m", "tool": "xtoy.measure"}]
        kinds = [e.kind for e in read_case_trace(out / cid)]  # from events.parquet
        assert kinds[0] == "case_started" and kinds[-1] == "case_finished" and "succeeded" in kinds
    # the failed case keeps everything a person needs beside it
    assert AUDIT <= _files(out / "q2") and "_DONE" not in _files(out / "q2")
    assert json.loads((out / "q2" / "result.json").read_text())["status"] == status["q2"]
    assert json.loads((out / "q2" / "plan.json").read_text())["steps"][0]["tool"] == "xtoy.measure"
    assert any(e.kind == "case_finished" for e in read_case_trace(out / "q2"))
    # the cohort tables hold every case, the lean ones included
    assert set(pq.read_table(out / "events.parquet").column("case").to_pylist()) == {"q0", "q1", "q2"}
    cells = pq.read_table(out / "measurements.parquet").to_pylist()
    assert {(c["case"], c["measure"]) for c in cells if c["measure"] == "mean"} == {("q0", "mean"), ("q1", "mean")}

    # resume: the lean cases' rows come back from their _DONE, unchanged
    again = _run(cases, out, audit=False)
    rows = {r["case"]: r for r in again.rows}
    assert rows["q0"]["resumed"] and rows["q1"]["resumed"] and not rows["q2"]["resumed"]
    assert rows["q1"]["measurements"] == next(r for r in result.rows if r["case"] == "q1")["measurements"]
    assert set(pq.read_table(out / "events.parquet").column("case").to_pylist()) == {"q0", "q1", "q2"}

    # q2's input mended: it succeeds, and its failed run's row no longer contradicts its _DONE
    write_nifti(Image(np.full((4, 4, 3), 3.0, np.float32), np.eye(4)), tmp_path / "in" / "q2" / "t1.nii.gz")
    third = {r["case"]: r for r in _run(cases, out, audit=False).rows}
    assert third["q2"]["status"] == "succeeded" and not third["q2"]["resumed"]
    assert not (out / "q2" / "result.json").exists()
    assert json.loads((out / "q2" / "_DONE").read_text())["measurements"]["stats.all.mean"] == pytest.approx(3.0)
    assert (out / "q2" / "events.jsonl").exists()  # the failed attempts' trace stays, this run appended


def test_audit_keeps_everything_for_every_case(ray_local, tmp_path):
    cases = _cases(tmp_path / "in")
    out = tmp_path / "out"
    _run(cases, out, audit=True)
    assert _files(out / "q0") == {"stats.json", "stats.csv", "provenance.json", "_DONE"} | AUDIT
    assert (out / "q0" / "stats.csv").read_text().splitlines()[0] == "label,mean,n"
    assert json.loads((out / "q0" / "result.json").read_text())["status"] == "succeeded"
    assert AUDIT <= _files(out / "q2")
