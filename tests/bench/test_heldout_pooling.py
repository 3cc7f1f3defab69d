"""benchmarks/heldout.py pools lesion detection over a cohort (found / true lesions) from the
truth the bench wrote, with the Wilson interval of the one metrics module."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest


def _heldout_module():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "heldout.py"
    spec = importlib.util.spec_from_file_location("bench_heldout", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_heldout"] = mod
    spec.loader.exec_module(mod)
    return mod


def _truth(work: Path, case: str, n_lesions: int) -> None:
    d = work / "data" / "prostate_report" / "dicom" / case
    d.mkdir(parents=True)
    (d / "bcer_truth.json").write_text(json.dumps({"values": {"lesions": [{"id": i} for i in range(n_lesions)]}}))


def test_pooled_sensitivity_weighs_lesions_not_cases(tmp_path: Path) -> None:
    mod = _heldout_module()
    # a three-lesion case finding all three and a one-lesion case finding none: the per-case
    # mean is 0.5, the pooled sensitivity 3/4; a lesion-free case adds a false positive
    for case, n in (("pr000", 3), ("pr001", 1), ("pr002", 0)):
        _truth(tmp_path, case, n)
    cases = [{"task": "prostate_report", "case": "pr000", "quality": {"lesion_sensitivity": 1.0, "lesion_false_positives": 0.0}},
             {"task": "prostate_report", "case": "pr001", "quality": {"lesion_sensitivity": 0.0, "lesion_false_positives": 0.0}},
             {"task": "prostate_report", "case": "pr002", "quality": {"lesion_sensitivity": None, "lesion_false_positives": 1.0}},
             {"task": "register_prostate", "case": "pr000", "quality": {}}]
    got = mod.pooled_lesions(cases, tmp_path)
    assert got["true_lesions"] == 4 and got["found"] == 3 and got["sensitivity"] == 0.75
    assert got["false_positives_per_case"] == pytest.approx(1 / 3, abs=1e-4)
    lo, hi = got["sensitivity_95ci"]
    assert lo == pytest.approx(0.301, abs=2e-3) and hi == pytest.approx(0.954, abs=2e-3)  # Wilson, 3 of 4


def test_an_undelivered_case_finds_nothing(tmp_path: Path) -> None:
    mod = _heldout_module()
    _truth(tmp_path, "pr000", 2)
    got = mod.pooled_lesions([{"task": "prostate_report", "case": "pr000", "quality": None}], tmp_path)
    assert got["found"] == 0 and got["true_lesions"] == 2 and got["sensitivity"] == 0.0
    assert mod.pooled_lesions([], tmp_path) is None
