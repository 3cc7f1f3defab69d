"""`bcer data inspect`: the detected layout, per-case runnable tasks and problems, table and JSON."""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
from typer.testing import CliRunner

from bcer.cli import main as cli
from bcer.cli.main import app

cli.console.width = 200


def _brats2023(root: Path, cid: str, seg_shape=(8, 8, 6)) -> None:
    d = root / cid
    d.mkdir(parents=True)
    for key in ("t1n", "t1c", "t2w", "t2f"):
        nib.save(nib.Nifti1Image(np.ones((8, 8, 6), np.float32), np.eye(4)), str(d / f"{cid}-{key}.nii.gz"))
    nib.save(nib.Nifti1Image(np.zeros(seg_shape, np.int16), np.eye(4)), str(d / f"{cid}-seg.nii.gz"))


def test_inspect_names_the_layout_tasks_and_a_broken_case(tmp_path: Path) -> None:
    _brats2023(tmp_path, "BraTS-GLI-00001-000")
    _brats2023(tmp_path, "BraTS-GLI-00002-000", seg_shape=(8, 8, 5))
    result = CliRunner().invoke(app, ["data", "inspect", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["case"]: r for r in json.loads(result.output)}
    good, bad = rows["BraTS-GLI-00001-000"], rows["BraTS-GLI-00002-000"]
    assert good["layout"] == "brats2023" and good["issues"] == []
    assert {"segment_brain", "brain_grade", "brain_report"} <= set(good["tasks"]) and "prostate_report" not in good["tasks"]
    assert bad["tasks"] == [] and "(8, 8, 5)" in bad["issues"][0] and bad["issues"][0].endswith("-seg.nii.gz)")
    result = CliRunner().invoke(app, ["data", "inspect", str(tmp_path)])
    assert result.exit_code == 0 and "layout brats2023: 2 case(s)" in result.output
    assert "segment_brain" in result.output
    result = CliRunner().invoke(app, ["data", "inspect", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "not found" in result.output
