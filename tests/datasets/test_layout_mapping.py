"""Flat layout for any other layout: a mapping file (CSV/TSV/YAML: case, sequence, path) over
NIfTI and .mha files, and a flat folder of .mha files named by sequence words."""
from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets import detect_layout, read_dataset
from bcer.datasets.layouts._inspect import inspect
from bcer.io import load_sequence


def _mha(path: Path, value: float, shape=(6, 7, 8)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = sitk.GetImageFromArray(np.full(shape[::-1], value, np.float32))
    img.SetSpacing((0.5, 0.5, 3.0))
    sitk.WriteImage(img, str(path))
    return path


def _nii(path: Path, value: float, shape=(6, 7, 8), dtype=np.float32) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.full(shape, value, dtype), np.diag([-0.5, -0.5, 3.0, 1.0])), str(path))
    return path


@pytest.fixture()
def scans(tmp_path: Path) -> Path:
    for i, case in enumerate(("pat01", "pat02")):
        _mha(tmp_path / "scans" / case / "t2_tra.mha", 100.0 + i)
        _mha(tmp_path / "scans" / case / "apparent.mha", 900.0 + i, shape=(3, 4, 5))
        _mha(tmp_path / "scans" / case / "highb.mha", 30.0 + i, shape=(3, 4, 5))
        _nii(tmp_path / "labels" / f"{case}.nii.gz", 1, dtype=np.int16)
    return tmp_path


def _csv_rows() -> str:
    rows = ["case,sequence,path"]
    for case in ("pat01", "pat02"):
        rows += [f"{case},T2w,scans/{case}/t2_tra.mha", f"{case},ADC,scans/{case}/apparent.mha",
                 f"{case},hbv,scans/{case}/highb.mha", f"{case},seg,labels/{case}.nii.gz"]
    return "\n".join(rows) + "\n"


def test_a_csv_mapping_file_is_the_dataset(scans: Path) -> None:
    mapping = scans / "cohort.csv"
    mapping.write_text(_csv_rows())
    assert detect_layout(mapping) == "flat"
    cases = read_dataset(mapping, strict=True)
    assert [c.id for c in cases] == ["pat01", "pat02"]
    c = cases[1]
    assert set(c.sequences) == {"T2w", "ADC", "DWI"} and c.domain == "prostate"
    assert c.sequences["ADC"].format == "itk" and float(load_sequence(c.sequences["ADC"]).data.mean()) == 901.0
    assert c.ground_truth["labels"]["seg"]["path"].endswith("labels/pat02.nii.gz")
    assert "prostate_report" in inspect(mapping)[0]["tasks"]


def test_yaml_mapping_in_the_folder_is_found_and_read_like_the_csv(scans: Path) -> None:
    lines = [f"{c}: {{T2w: scans/{c}/t2_tra.mha, ADC: scans/{c}/apparent.mha, DWI: scans/{c}/highb.mha}}"
             for c in ("pat01", "pat02")]
    (scans / "bcer_mapping.yaml").write_text("\n".join(lines) + "\n")
    assert detect_layout(scans) == "flat"
    cases = read_dataset(scans, strict=True)
    assert [c.id for c in cases] == ["pat01", "pat02"] and cases[0].ground_truth is None
    assert float(load_sequence(cases[0].sequences["T2w"]).data.mean()) == 100.0


def test_mapping_errors_name_case_row_and_file(scans: Path) -> None:
    mapping = scans / "cohort.csv"
    mapping.write_text(_csv_rows().replace("scans/pat02/highb.mha", "scans/pat02/nope.mha"))
    with pytest.raises(ToolError) as e:
        read_dataset(mapping, strict=True)
    err = e.value
    assert err.code == ErrorCode.input_missing and err.context["case"] == "pat02"
    assert "line 8" in err.message and err.context["file"].endswith("scans/pat02/nope.mha")
    mapping.write_text("case,sequence,path\npat01,T3x,scans/pat01/t2_tra.mha\n")
    with pytest.raises(ToolError) as e:
        read_dataset(mapping, strict=True)
    assert e.value.code == ErrorCode.schema and "'T3x' is not a sequence name" in e.value.message
    mapping.write_text(_csv_rows().replace("pat02,hbv", "pat02,T2w", 1))  # a case with two T2w files
    with pytest.raises(ToolError) as e:
        read_dataset(mapping, strict=True)
    assert e.value.code == ErrorCode.schema and "two files for T2w" in e.value.message


def test_a_case_missing_a_sequence_the_others_have_is_named(scans: Path) -> None:
    mapping = scans / "cohort.tsv"
    mapping.write_text(_csv_rows().replace(",", "\t").replace("pat02\tADC\tscans/pat02/apparent.mha\n", ""))
    with pytest.raises(ToolError) as e:
        read_dataset(mapping, strict=True)
    assert e.value.code == ErrorCode.input_missing and e.value.context["case"] == "pat02"
    assert "has no ADC" in e.value.message


def test_a_flat_folder_of_mha_files_named_by_sequence_words(tmp_path: Path) -> None:
    for case in ("c1", "c2"):
        for i, word in enumerate(("t1", "t1ce", "t2", "flair")):
            _mha(tmp_path / f"{case}_{word}.mha", 10.0 * (i + 1))
    assert detect_layout(tmp_path) == "flat"
    cases = read_dataset(tmp_path, strict=True)
    assert [c.id for c in cases] == ["c1", "c2"] and set(cases[0].sequences) == {"T1", "T1c", "T2", "FLAIR"}
    img = load_sequence(cases[0].sequences["FLAIR"])
    assert float(img.data.mean()) == 40.0 and img.shape == (6, 7, 8)
    np.testing.assert_allclose(img.spacing, (0.5, 0.5, 3.0))
