"""One case row: an outcome, an error and a resumed case give rows of the same shape, which the
cohort summary and the bench read alike."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from bcer.contracts import Case, ErrorCode, ToolError
from bcer.engine.context import CaseOutcome
from bcer.engine.rows import CaseRow, resumed_row


def _cfg(out: Path) -> SimpleNamespace:
    return SimpleNamespace(contract=SimpleNamespace(id="seg"), run_id="r1", planner=SimpleNamespace(name="offline"),
                           out=out)


def test_error_outcome_and_resumed_rows_share_one_shape(tmp_path):
    case, cfg = Case(id="c1", root=str(tmp_path)), _cfg(tmp_path)
    err = ToolError(ErrorCode.input_missing, "no T2", node="load")
    bad = CaseRow.from_error(case, cfg, err, "rejected", t0=0.0).to_dict()
    outcome = CaseOutcome("c1", "succeeded", deliverables={"seg": tmp_path / "c1" / "seg.nii.gz"}, sr=1, tcr=1.0,
                          sr_delivered=1, repairs=2, cache_hits=3,
                          measurement_rows=[{"measure": "low_confidence", "value": 1.0}])
    good = CaseRow.from_outcome(case, cfg, outcome, revisions=1, t0=0.0).to_dict()
    assert set(bad) == set(good)
    assert (bad["status"], bad["sr"], bad["error_code"], bad["error_node"], bad["plan_revisions"]) == (
        "rejected", 0, "input_missing", "load", None)
    assert (good["sr"], good["repairs"], good["cache_hits"], good["deliverables"], good["low_confidence"]) == (
        1, 2, 3, {"seg": "c1/seg.nii.gz"}, True)
    (tmp_path / "c1").mkdir()
    (tmp_path / "c1" / "result.json").write_text(json.dumps(good))
    assert resumed_row(str(tmp_path / "c1")) is None  # no _DONE: the case runs again
    (tmp_path / "c1" / "_DONE").write_text("{}")
    again = resumed_row(str(tmp_path / "c1")).to_dict()
    assert set(again) == set(good) and again["resumed"] is True and again["cache_hits"] == 3


def test_a_row_written_before_plausibility_counts_its_sr_as_delivered(tmp_path):
    from bcer.engine.cohort import CohortResult

    old = {"case": "a", "task": "seg", "run": "r0", "status": "succeeded", "sr": 1, "tcr": 1.0}
    implausible = {"case": "b", "task": "seg", "run": "r1", "status": "implausible", "sr": 0, "sr_delivered": 1,
                   "tcr": 0.5}
    assert CaseRow.from_dict(old).delivered == 1 and CaseRow.from_dict(implausible).delivered == 1
    summary = CohortResult(tmp_path, [old, implausible], "r1").summary()
    assert summary == {"cases": 2, "succeeded": 1, "failed": 1, "implausible": 1, "resumed": 0, "sr": 0.5,
                       "sr_delivered": 1.0, "tcr": 0.75}
