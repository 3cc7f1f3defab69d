"""`bcer bench --family`: the family reaches the generators, the layout and bench.json; a task
whose generator lacks the family fails before anything is synthesised."""
from __future__ import annotations

import json

import pytest

from bcer.bench import run_bench
from bcer.bench import cases as bench_cases
from bcer.bench.cases import TaskData, family_options, supports_family
from bcer.contracts import ErrorCode, ToolError


def test_family_options_follow_the_generator(monkeypatch) -> None:
    assert family_options("prostate_report", "base") == {}
    assert family_options("register_prostate", "heldout") == {"family": "heldout"}
    assert supports_family("prostate_report", "randomised")
    monkeypatch.setitem(bench_cases.TASK_DATA, "base_only_task",
                        TaskData(lambda *a, **k: None, ("bids",), "bo", "bcer.datasets.phantom:Phantom"))
    assert not supports_family("base_only_task", "heldout") and supports_family("base_only_task", "base")
    with pytest.raises(ToolError) as e:
        family_options("base_only_task", "heldout")
    assert e.value.code is ErrorCode.value_range
    with pytest.raises(ToolError) as e:
        family_options("prostate_report", "held-out")
    assert e.value.code is ErrorCode.value_range
    assert bench_cases.TASK_DATA["prostate_report"].layout(0, "heldout") == "dicom"
    assert bench_cases.TASK_DATA["prostate_report"].layout(0, "base") == "bids"


def test_bench_records_the_family_and_writes_dicom(ray_local, tmp_path) -> None:
    with pytest.raises(ToolError) as e:  # checked before any synthesis
        run_bench(["register_prostate"], 1, tmp_path / "x", family="nope")
    assert e.value.code is ErrorCode.value_range and not (tmp_path / "x" / "data").exists()
    report = run_bench(["register_prostate"], 1, tmp_path / "b", size="small", seed=1, family="randomised")
    saved = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert saved["config"]["family"] == "randomised" == report["config"]["family"]
    assert (tmp_path / "b" / "data" / "register_prostate" / "dicom").is_dir()
    (row,) = report["cases"]
    assert row["sr"] == 1 and row["quality"]["registration_error_mm"] <= 1.0
