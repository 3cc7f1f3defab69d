"""Cohort runner and Python API: failures become rows, others finish, reruns resume."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import bcer
from bcer.contracts import (Case, DeliverableSpec, Image, PlanSketch, SequenceRef, TaskContract,
                            Validator)
from bcer.engine.cohort import CohortConfig, run_cohort
from bcer.engine.driver import admit_case
from bcer.engine.planning import StaticPlanner
from bcer.io import write_nifti


pytestmark = pytest.mark.timeout(180)
AFFINE = np.diag([-1.2, 1.2, 3.0, 1.0])

CONTRACT = TaskContract(
    id="toy_step", domain="any", goal="add one twice", inputs=["T1"], milestones=["stepped"],
    deliverables=[DeliverableSpec(name="stepped", kind="image", milestone="stepped", file="stepped.nii.gz",
                                  validators=[Validator(type="nifti_nonempty"),
                                              Validator(type="affine_matches_input", arg="T1")])])
PLAN = PlanSketch(goal="add one twice", steps=[
    {"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
    {"id": "b", "tool": "xtoy.step", "args": {"img": "@node.a.image", "add": 2.0}}])


def make_cases(root: Path, n: int, corrupt: int | None = None) -> list[Case]:
    cases = []
    for i in range(n):
        d = root / f"sub{i:02d}"
        d.mkdir(parents=True, exist_ok=True)
        path = write_nifti(Image(np.full((6, 5, 4), float(i), np.float32), AFFINE), d / "t1.nii.gz")
        if i == corrupt:
            raw = path.read_bytes()
            path.write_bytes(raw[: len(raw) // 2])  # a truncated .nii.gz
        cases.append(Case(id=f"sub{i:02d}", root=str(d), domain="brain",
                          sequences={"T1": SequenceRef(path=str(path))}))
    return cases


def test_corrupt_case_becomes_a_row_others_finish_and_rerun_resumes(ray_local, tmp_path):
    cases = make_cases(tmp_path / "in", 4, corrupt=2)
    out = tmp_path / "out"
    cfg = CohortConfig(out=out, planner=StaticPlanner(PLAN), contract=CONTRACT, max_in_flight=3)
    result = run_cohort(cases, cfg)
    rows = {r["case"]: r for r in result.rows}
    assert [r["case"] for r in result.rows] == [c.id for c in cases]  # input order kept
    bad = rows["sub02"]
    assert bad["status"] != "succeeded" and bad["sr"] == 0
    assert bad["error_code"] == "schema" and "t1.nii.gz" in bad["error_message"]
    for cid in ("sub00", "sub01", "sub03"):
        assert rows[cid]["status"] == "succeeded" and rows[cid]["sr"] == 1 and rows[cid]["tcr"] == 1.0
        assert (out / cid / "_DONE").exists()
        img = bcer.io.read_nifti(out / cid / "stepped.nii.gz")
        assert np.allclose(img.data, int(cid[-2:]) + 3.0) and np.allclose(img.affine, AFFINE)
    assert not (out / "sub02" / "_DONE").exists()
    table = pq.read_table(out / "cohort.parquet")
    assert table.num_rows == 4 and set(table.column_names) >= {"case", "status", "sr", "tcr", "error_code"}
    events = pq.read_table(out / "events.parquet")
    assert set(events.column("case").to_pylist()) >= {"sub00", "sub01", "sub03"}
    desc = json.loads((out / "dataset_description.json").read_text())
    assert desc["DatasetType"] == "derivative" and desc["bcer"]["summary"]["succeeded"] == 3

    # rerun on the same folder: finished cases are skipped and say so; the bad one runs again
    again = run_cohort(cases, CohortConfig(out=out, planner=StaticPlanner(PLAN), contract=CONTRACT))
    rows2 = {r["case"]: r for r in again.rows}
    assert all(rows2[c]["resumed"] for c in ("sub00", "sub01", "sub03"))
    assert not rows2["sub02"].get("resumed") and rows2["sub02"]["error_code"] == "schema"
    started = [e for e in again.events.to_pylist() if e["kind"] == "started" and e["run"] == again.run_id]
    assert {e["case"] for e in started} <= {"sub02"}


def test_contract_rejects_missing_sequence_and_wrong_domain_with_typed_reason(tmp_path):
    case = make_cases(tmp_path, 1)[0]
    with pytest.raises(bcer.contracts.ToolError) as e:
        admit_case(case.model_copy(update={"sequences": {}}), CONTRACT)
    assert e.value.code.value == "input_missing" and "T1" in e.value.message
    cardiac_only = CONTRACT.model_copy(update={"domain": "cardiac"})
    with pytest.raises(bcer.contracts.ToolError) as e:
        admit_case(case, cardiac_only)
    assert e.value.code.value == "input_missing" and "cardiac" in e.value.message


def test_study_api_returns_tables_and_rejected_row(ray_local, tmp_path):
    cases = make_cases(tmp_path / "in", 2)
    cases[1] = cases[1].model_copy(update={"sequences": {}})
    result = bcer.Study(cases, task=CONTRACT, plan=PLAN, out=tmp_path / "out").run()
    assert result.cases.num_rows == 2
    statuses = dict(zip(result.cases.column("case").to_pylist(), result.cases.column("status").to_pylist()))
    assert statuses == {"sub00": "succeeded", "sub01": "rejected"}
    assert result.events.num_rows > 0
    row = bcer.run_case(cases[0], task=CONTRACT, plan=PLAN, out=tmp_path / "one")
    assert row["status"] == "succeeded" and "stepped" in row["deliverables"]


def test_outputs_carry_their_origin_node_and_field(ray_local, tmp_path):
    contract = TaskContract(
        id="toy_measure", domain="any", goal="measure", inputs=["T1"], milestones=["measured"],
        deliverables=[DeliverableSpec(name="stats", kind="table", milestone="measured", file="stats.json",
                                      validators=[Validator(type="table_rows", arg=1)])])
    plan = PlanSketch(goal="measure", steps=[
        {"id": "first", "tool": "xtoy.step", "args": {"img": "@seq.T1"}},
        {"id": "stats_node", "tool": "xtoy.measure", "args": {"img": "@node.first.image"}}])
    row = bcer.run_case(make_cases(tmp_path / "in", 1)[0], task=contract, plan=plan, out=tmp_path / "out")
    assert row["status"] == "succeeded"
    doc = json.loads((tmp_path / "out" / row["deliverables"]["stats"]).read_text())
    assert doc["meta"]["origin"] == {"node": "stats_node", "field": "table", "tool": "xtoy.measure"}
    assert doc["rows"][0]["mean"] == pytest.approx(1.0)
