"""Cohort tables key every measurement by what it is: a case without necrosis and a case without
enhancement still put each compartment's volume in the column of that compartment, and the
long-form ``measurements.parquet`` holds every value with its unit."""
from __future__ import annotations

import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from bcer.contracts import Case, Image, PlanSketch, SequenceRef
from bcer.engine.cohort import CohortConfig, run_cohort
from bcer.engine.planning import StaticPlanner
from bcer.engine.tables import MEASUREMENT_COLUMNS
from bcer.io import write_nifti

VOXEL_ML = 2.0 * 2.0 * 2.0 / 1000.0
AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])
# case -> voxel count of each compartment (label value -> voxels); 0 = absent
CASES = {"no_necrosis": {1: 0, 2: 40, 4: 12}, "no_enhancing": {1: 9, 2: 30, 4: 0}, "all_three": {1: 5, 2: 20, 4: 7}}


def _label_map(counts: dict[int, int]) -> np.ndarray:
    lab = np.zeros((10, 10, 8), np.float32)
    flat = lab.reshape(-1)
    start = 0
    for value, n in counts.items():
        flat[start:start + n] = value
        start += n + 3
    return lab


def _cases(root) -> list[Case]:
    cases = []
    for cid, counts in CASES.items():
        path = write_nifti(Image(_label_map(counts), AFFINE), root / cid / "t1.nii.gz")
        cases.append(Case(id=cid, root=str(root / cid), sequences={"T1": SequenceRef(path=str(path))}))
    return cases


def test_columns_name_their_compartment_in_every_row(ray_local, tmp_path):
    plan = PlanSketch(goal="tumour volumes", steps=[
        {"id": "mk", "tool": "xtoy.as_mask", "args": {"img": "@seq.T1"}},
        {"id": "features", "tool": "quant.roi_features", "args": {"image": "@seq.T1", "mask": "@node.mk.mask"}}])
    result = run_cohort(_cases(tmp_path / "data"), CohortConfig(out=tmp_path / "out", planner=StaticPlanner(plan)))
    assert all(r["status"] == "succeeded" for r in result.rows), [r.get("error_message") for r in result.rows]

    table = pq.read_table(tmp_path / "out" / "cohort.parquet").to_pylist()
    columns = set(table[0])
    assert not [c for c in columns if re.search(r"\.\d+\.", c)]  # no column keyed by row position
    names = {1: "necrotic_core", 2: "oedema", 4: "enhancing"}
    for row in table:
        for value, n in CASES[row["case"]].items():
            got = row.get(f"m_features.{names[value]}.volume_ml")
            if n == 0:
                assert got is None  # absent: null in that compartment's column, never another's value
            else:
                assert got == pytest.approx(n * VOXEL_ML)

    long = pq.read_table(tmp_path / "out" / "measurements.parquet")
    assert long.column_names == list(MEASUREMENT_COLUMNS)
    vols = {(r["case"], r["row"]): (r["value"], r["unit"]) for r in long.to_pylist()
            if r["deliverable"] == "features" and r["measure"] == "volume_ml"}
    want = {(cid, names[v]): n * VOXEL_ML for cid, counts in CASES.items() for v, n in counts.items() if n}
    assert set(vols) == set(want)
    assert all(vols[k][0] == pytest.approx(want[k]) and vols[k][1] == "mL" for k in want)
    # the in-memory result carries the same long table
    assert result.measurements.num_rows == long.num_rows


def test_a_mask_s_confidence_reaches_the_row():
    from bcer.contracts import Mask
    from bcer.engine.rows import low_confidence
    from bcer.engine.outputs import case_records, measurement_records, wide_measurements

    conf = {"score": 0.62, "threshold": 0.671, "low_confidence": True, "method": "network vs classical"}
    mask = Mask(np.ones((2, 2, 2), np.int16), np.eye(4), {"confidence": conf}, labels={1: "lv"})
    recs = measurement_records("labels", mask)
    wide = wide_measurements(recs)
    assert wide["labels.confidence_score"] == pytest.approx(0.62) and wide["labels.low_confidence"] is True
    rows = case_records({"labels": {"records": recs}})
    assert low_confidence(rows) is True
    conf_ok = dict(conf, score=0.9, low_confidence=False)
    ok = case_records({"labels": {"records": measurement_records("labels", Mask(mask.data, np.eye(4),
                                                                                 {"confidence": conf_ok}))}})
    assert low_confidence(ok) is False and low_confidence([]) is None
