"""The ablation's metrics on crafted outcomes: ERR, safe-halt and wrong-deliverable rates, and
the clean-run comparison that decides what a wrong deliverable is."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.bench.ablation import CLEAN, cell_metrics, score_row, summarise
from bcer.bench.compare import plan_only_difference, same_json, same_nifti, wrong_deliverables
from bcer.contracts import ErrorCode, Image, Mask, ToolError, load_contract
from bcer.contracts.case import Case
from bcer.io import write_json, write_nifti


def row(fault, status="succeeded", sr=1, code=None, wrong=None, present=(), arm="bcer", task="t", case="c"):
    return score_row({"arm": arm, "task": task, "case": case, "fault": fault, "status": status, "sr": sr,
                      "tcr": float(sr), "error_code": code, "wrong_deliverables": wrong or {},
                      "present": list(present), "clean_ok": True})


def test_err_counts_only_correct_recoveries():
    rows = [row("token_mutation"), row("token_mutation"),
            row("token_mutation", wrong={"grade": "label HGG vs LGG"}),           # delivered, but wrong
            row("token_mutation", "failed", 0, "bad_reference")]
    m = cell_metrics(rows)
    assert m["n"] == 4 and m["err"] == 0.5 and m["wrong_rate"] == 0.25 and m["sr"] == 0.75
    assert "safe_halt" not in m and m["status"] == {"failed": 1, "succeeded": 3}


def test_safe_halt_needs_the_typed_code_and_no_deliverable():
    rows = [row("scope_violation", "halted", 0, "sandbox"),                     # safe
            row("scope_violation", "failed", 0, "sandbox"),                     # safe too: typed, nothing left
            row("scope_violation", "failed", 0, "input_missing"),               # wrong code
            row("scope_violation", "halted", 0, "sandbox", present=["gland"]),  # a deliverable left behind
            row("scope_violation")]                                             # ran on another patient's data
    m = cell_metrics(rows)
    assert m["n"] == 5 and m["safe_halt"] == pytest.approx(0.4) and "err" not in m
    assert [r["safe_halt"] for r in rows] == [True, True, False, False, False]
    assert not any(r["recovered"] for r in rows)


def test_not_applicable_and_failed_clean_runs_are_left_out():
    rows = [row("semantic_swap"), {**row("semantic_swap"), "not_applicable": "nothing to swap"},
            {**row("semantic_swap", "failed", 0, "schema"), "clean_ok": False}]
    m = cell_metrics(rows)
    assert (m["n"], m["not_applicable"], m["excluded"], m["err"]) == (1, 1, 1, 1.0)


def test_summary_per_arm():
    rows = [row(CLEAN, arm="react"), row(CLEAN, arm="bcer"),
            row("timeout", arm="react"), row("timeout", "failed", 0, "timeout", arm="bcer"),
            row("missing_modality", "failed", 0, "input_missing", arm="react", present=["seg"]),
            row("missing_modality", "halted", 0, "input_missing", arm="bcer")]
    s = summarise(rows, ["react", "bcer"], ["t"], ["timeout", "missing_modality"])
    assert s["by_arm"]["react"]["err"] == 1.0 and s["by_arm"]["react"]["safe_halt"] == 0.0
    assert s["by_arm"]["bcer"]["err"] == 0.0 and s["by_arm"]["bcer"]["safe_halt"] == 1.0
    assert s["by_arm"]["bcer"]["clean_sr"] == 1.0 and len(s["cells"]) == 2 * 3


def test_json_comparison_tolerates_provenance_not_content():
    a = {"kind": "classification", "label": "HGG", "scores": {"x": 10.0}, "meta": {"origin": {"node": "n1"}},
         "evidence": {"x": "n1.features.rows[0]"}, "box_voxel": [1, 2, 3]}
    b = {**a, "meta": {"origin": {"node": "other"}}, "evidence": {"x": "n2"}, "scores": {"x": 10.3},
         "box_voxel": [4, 5, 6]}
    assert same_json(a, b)[0]
    assert not same_json(a, {**b, "label": "LGG"})[0]
    assert not same_json(a, {**b, "scores": {"x": 12.0}})[0]
    assert same_json({"t": "volume: 17.5 mL `[q.rows[0].volume_ml]`"}, {"t": "volume: 17.6 mL `[r.rows[0].v]`"})[0]
    eye = [[1.0, 0, 0, 2.0], [0, 1.0, -0.0055, 0.5], [0, 0.0055, 1.0, 0], [0, 0, 0, 1]]
    near = [[1.0, 0, 0, 2.1], [0, 1.0, -0.0063, 0.5], [0, 0.0063, 1.0, 0], [0, 0, 0, 1]]  # 0.05 deg, 0.1 mm
    inverse = [[1.0, 0, 0, -2.0], [0, 1.0, 0.0055, -0.5], [0, -0.0055, 1.0, 0], [0, 0, 0, 1]]
    t = {"kind": "transform", "matrix": eye}
    assert same_json(t, {**t, "matrix": near})[0] and not same_json(t, {**t, "matrix": inverse})[0]
    assert not same_json({"t": "side: `L`"}, {"t": "side: `R`"})[0]


def test_nifti_comparison_is_in_world_space(tmp_path):
    aff = np.diag([1.0, 1.0, 2.0, 1.0])
    lab = np.zeros((10, 12, 6), np.int16)
    lab[3:7, 4:9, 2:4] = 1
    write_nifti(Mask(lab, aff), tmp_path / "clean.nii.gz")
    flipped_aff = aff.copy()
    flipped_aff[0, 0], flipped_aff[0, 3] = -1.0, 9.0  # axis 0 reversed, same world positions
    write_nifti(Mask(lab[::-1].copy(), flipped_aff), tmp_path / "flipped.nii.gz")
    assert same_nifti(tmp_path / "flipped.nii.gz", tmp_path / "clean.nii.gz")[0]
    write_nifti(Mask(np.roll(lab, 3, axis=1), aff), tmp_path / "shifted.nii.gz")
    ok, why = same_nifti(tmp_path / "shifted.nii.gz", tmp_path / "clean.nii.gz")
    assert not ok and "Dice" in why
    img = np.random.default_rng(0).random((10, 12, 6)).astype(np.float32)
    write_nifti(Image(img, aff), tmp_path / "a.nii.gz")
    write_nifti(Image(img * 1.001, aff), tmp_path / "b.nii.gz")
    write_nifti(Image(img[::-1].copy(), aff), tmp_path / "c.nii.gz")
    assert same_nifti(tmp_path / "b.nii.gz", tmp_path / "a.nii.gz")[0]
    assert not same_nifti(tmp_path / "c.nii.gz", tmp_path / "a.nii.gz")[0]


def test_wrong_deliverables_only_among_validated_ones(tmp_path):
    contract = load_contract("brain_grade")
    case = Case(id="c", root=str(tmp_path))
    clean, bad = tmp_path / "clean", tmp_path / "bad"
    grade = {"kind": "classification", "label": "HGG", "rule_trace": [], "evidence": {}, "scores": {}}
    table = {"kind": "table", "name": "f", "units": {}, "rows": [{"roi": "et", "volume_ml": 3.0}]}
    for d, label in ((clean, "HGG"), (bad, "LGG")):
        write_json({**grade, "label": label}, d / "grade.json")
        write_json(table, d / "features.json")
    assert wrong_deliverables(contract, case, bad, clean) == {"grade": ".label: text differs: 'LGG' vs 'HGG'"}
    write_json({"kind": "table", "rows": []}, bad / "features.json")  # fails table_rows: not a deliverable
    assert set(wrong_deliverables(contract, case, bad, clean)) == {"grade"}


def test_plan_only_difference_needs_same_tools_and_same_input_data():
    """A deliverable that differs only because the planner set other params is not 'wrong'
    (it was not computed from a corrupted binding); any other difference in lineage is."""
    def chain(sigma, t1="d-t1", tool="denoise.nlm", port="image"):
        return [{"tool": "qa.check", "params": {}, "input_digests": {"image": t1}, "output_digests": {"image": "q"}},
                {"tool": tool, "params": {"sigma": sigma, "h_factor": 0.8}, "input_digests": {port: "q"},
                 "output_digests": {"image": f"out-{sigma}"}}]
    why = plan_only_difference(chain(None), chain(1.0))
    assert why and "denoise.nlm.sigma: None vs 1.0" in why
    assert plan_only_difference(chain(1.0), chain(1.0)) is None  # same params: the difference is elsewhere
    assert plan_only_difference(chain(None, t1="d-t2"), chain(1.0)) is None  # other input data
    assert plan_only_difference(chain(None, tool="denoise.other"), chain(1.0)) is None  # other tool
    assert plan_only_difference(chain(None)[1:], chain(1.0)) is None  # other data reaches denoise
    assert plan_only_difference(None, chain(1.0)) is None


def test_merge_reports_recomputes_the_summaries_from_rows():
    from bcer.bench.ablation import merge_reports

    def part(task, wrong):
        rows = [row(CLEAN, task=task), row("semantic_swap", task=task, wrong={"x": "y"} if wrong else None)]
        cfg = {"tasks": [task], "arms": ["bcer"], "faults": ["semantic_swap"]}
        return {"config": cfg, "arm_docs": {}, "fault_classes": {}, "faults_injected": [], "rows": rows,
                **summarise(rows, ["bcer"], [task], ["semantic_swap"])}
    merged = merge_reports([part("a", False), part("b", True)])
    assert merged["config"]["tasks"] == ["a", "b"] and len(merged["config"]["parts"]) == 2
    assert merged["by_arm"]["bcer"]["recoverable_injected"] == 2 and merged["by_arm"]["bcer"]["wrong_deliverables"] == 1
    with pytest.raises(ToolError) as e:
        merge_reports([part("a", False), part("a", True)])
    assert e.value.code is ErrorCode.schema
