"""`bcer bench` end to end on small phantoms: SR/TCR per task, quality beside it, rejected
cases as typed SR-0 rows, and the quality metrics themselves against known answers."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bcer.bench import resolve_tasks, run_bench
from bcer.bench.bench import run_task_cases
from bcer.bench.quality import case_quality
from bcer.bench.quality import scored_dice as dice
from bcer.metrics import box_iou
from bcer.contracts import ErrorCode, ToolError, load_contract

ALL = resolve_tasks("all")


@pytest.fixture(scope="module")
def bench(bench_all) -> tuple[dict, Path]:
    return bench_all


def test_every_task_succeeds_with_the_offline_brain(bench) -> None:
    report, out = bench
    assert json.loads((out / "bench.json").read_text())["tasks"].keys() == report["tasks"].keys()
    assert sorted(report["tasks"]) == sorted(ALL) and len(ALL) == 10
    for task, s in report["tasks"].items():
        assert s["cases"] == 1 and s["sr"] == 1.0 and s["tcr"] == 1.0, (task, s["failures"])
        assert s["median_case_s"] > 0
        # SR (delivered) and SR (plausible) side by side; no false alarm on today's phantoms
        assert s["sr_delivered"] == 1.0 and s["implausible"] == 0
        declared = {c.check for c in load_contract(task).plausibility}
        assert set(s["plausibility"]) == declared and all(p["failed"] == 0 for p in s["plausibility"].values())
    for row in report["cases"]:
        assert row["sr_delivered"] == 1 and all(p["ok"] is not False for p in row["plausibility"])
        case_dir = out / "runs" / row["task"] / row["case"]
        assert (case_dir / "_DONE").exists() and (case_dir / "workflow.json").exists()
        for d in load_contract(row["task"]).deliverables:
            assert (case_dir / d.file).stat().st_size > 0


def test_quality_is_measured_against_truth(bench) -> None:
    report, _ = bench
    q = {t: {k: v["mean"] for k, v in s["quality"].items()} for t, s in report["tasks"].items()}
    assert q["segment_brain"]["dice_wt"] >= 0.85 and q["brain_report"]["dice_et"] >= 0.70
    assert 0 <= q["register_prostate"]["registration_error_mm"] <= 1.0
    assert q["denoise"]["psnr_gain_db"] >= 3.0 and 0 < q["denoise"]["nrmse"] < 1
    assert q["superres"]["psnr_gain_vs_nearest_db"] >= 1.0
    assert 0 < q["recon_cardiac"]["nrmse"] < 0.2 and 0 < q["recon_cardiac"]["nrmse_ratio_vs_zero_filled"] < 1
    assert 0 < q["recon"]["nrmse"] < 0.2 and 0 < q["recon"]["nrmse_ratio_vs_zero_filled"] < 1
    assert q["cardiac_report"]["ed_es_exact"] == 1.0
    assert q["brain_grade"]["grade_accuracy"] in (0.0, 1.0)
    assert q["cardiac_report"]["ef_error_pts"] <= 3.0 and q["cardiac_report"]["dice_lv"] >= 0.9
    assert q["prostate_report"]["gland_dice"] >= 0.85 and q["prostate_report"]["lesion_false_positives"] <= 1


def test_a_perfect_deliverable_scores_perfectly(bench, tmp_path) -> None:
    """Swap the delivered label map for the truth: Dice 1; shift it: Dice drops."""
    import nibabel as nib

    from bcer.api import load_cases

    _, out = bench
    contract = load_contract("segment_brain")
    (case,) = load_cases(out / "data" / "segment_brain" / "brats")
    case_dir = tmp_path / case.id
    shutil.copytree(out / "runs" / "segment_brain" / case.id, case_dir)
    truth = nib.load(case.ground_truth["labels"]["seg"]["path"])
    nib.save(truth, str(case_dir / "seg.nii.gz"))
    assert case_quality(case, case_dir, contract) == {"dice_wt": 1.0, "dice_tc": 1.0, "dice_et": 1.0}
    shifted = np.roll(np.asarray(truth.dataobj), 3, axis=0)
    nib.save(nib.Nifti1Image(shifted, truth.affine), str(case_dir / "seg.nii.gz"))
    assert case_quality(case, case_dir, contract)["dice_wt"] < 0.95


def test_cases_the_contract_cannot_accept_end_as_typed_sr0(bench, tmp_path) -> None:
    from bcer.api import load_cases

    _, out = bench
    (cardiac,) = load_cases(out / "data" / "cardiac_report" / "acdc")
    (prostate,) = load_cases(out / "data" / "prostate_report" / "bids")
    no_dwi = prostate.model_copy(update={"id": "no_dwi", "sequences": {
        k: v for k, v in prostate.sequences.items() if k != "DWI"}})
    res_seg, res_pr = run_task_cases({"segment_brain": [cardiac], "prostate_report": [no_dwi]}, tmp_path)
    for res, words in ((res_seg, ("brain", "cardiac")), (res_pr, ("DWI",))):
        (row,) = res["rows"]
        assert row["sr"] == 0 and row["tcr"] == 0.0 and row["status"] == "rejected"
        assert row["error_code"] == ErrorCode.input_missing.value
        assert all(w in row["error_message"] for w in words)


def test_metric_helpers_give_known_answers() -> None:
    a = np.zeros((4, 4, 4), bool)
    a[:2] = True
    b = np.zeros((4, 4, 4), bool)
    b[1:3] = True
    assert dice(a, b) == pytest.approx(0.5) and dice(a, a) == 1.0 and dice(~a & a, ~a & a) is None
    assert box_iou([[0, 0, 0], [2, 2, 2]], [[1, 0, 0], [3, 2, 2]]) == pytest.approx(4 / 12)
    assert box_iou([[0, 0, 0], [1, 1, 1]], [[5, 5, 5], [6, 6, 6]]) == 0.0


def test_unknown_task_is_a_typed_error(tmp_path) -> None:
    with pytest.raises(ToolError) as e:
        run_bench("segment_brian", 1, tmp_path)
    assert e.value.code == ErrorCode.value_range and "segment_brain" in e.value.hint


def test_bench_reads_a_data_folder(bench, tmp_path) -> None:
    """``data`` given: the cases are read (per task sub-folder, one dataset per layout), not made."""
    first, out = bench
    report = run_bench("superres,recon_cardiac", 5, tmp_path, data=out / "data")
    assert sorted(report["tasks"]) == ["recon_cardiac", "superres"] and report["config"]["size"] is None
    for task in ("superres", "recon_cardiac"):
        assert report["tasks"][task]["sr"] == 1.0
        assert {r["case"] for r in report["cases"] if r["task"] == task} == \
            {r["case"] for r in first["cases"] if r["task"] == task}
    assert not (tmp_path / "data").exists()


def test_rows_take_quality_scored_during_the_run_or_none_at_all(tmp_path, monkeypatch) -> None:
    """Quality scored as each case finished is used as is; a case not scored yet is scored
    now; ``scored=None`` (a speed benchmark) scores nothing."""
    from types import SimpleNamespace

    from bcer.bench import bench as b
    from bcer.contracts import Case

    calls: list[str] = []
    monkeypatch.setattr(b, "case_quality", lambda case, case_dir, contract: calls.append(case.id) or {"dice": 0.5})
    cases = [Case(id=i, root=str(tmp_path), sequences={}, ground_truth={"seg": "x"}) for i in ("a", "b")]
    for c in cases:
        (tmp_path / c.id).mkdir()
        (tmp_path / c.id / "workflow.json").write_text("{}")
    result = SimpleNamespace(out=tmp_path, rows=[{"case": "a", "status": "succeeded", "sr": 1},
                                                 {"case": "b", "status": "succeeded", "sr": 1}])
    contract = load_contract("segment_brain")
    rows = b._task_rows("segment_brain", cases, result, contract, {"a": {"dice": 0.9}})
    assert [r["quality"] for r in rows] == [{"dice": 0.9}, {"dice": 0.5}] and calls == ["b"]
    rows = b._task_rows("segment_brain", cases, result, contract, None)
    assert [r["quality"] for r in rows] == [{}, {}] and calls == ["b"]
