"""DICOM layout as scanners export it: several series mixed in one folder, chosen by
SeriesDescription patterns (--seq), and broken series named with their case when read."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from bcer.contracts.artifacts import Image
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets import detect_layout, read_dataset
from bcer.datasets.layouts import flat
from bcer.datasets.layouts._inspect import inspect
from bcer.io import load_sequence
from bcer.io.dicom import write_series

A = np.diag([0.8, 0.8, 3.0, 1.0])
# (SeriesDescription, series number, value, slices) as a Siemens prostate export names them
SERIES = [("localizer", 1, 5.0, 3), ("t2_tse_sag", 2, 7.0, 4), ("t2_tse_tra", 3, 100.0, 6),
          ("t2_tse_tra_repeat", 4, 110.0, 6), ("ep2d_diff_b50_800_ADC", 5, 900.0, 5),
          ("ep2d_diff_b1400_CALC_BVAL", 6, 30.0, 5)]
SEQ = ["T2w=t2_tse_tra", "ADC=*diff*adc*", "DWI=*calc_bval"]


def _export(case_dir: Path) -> Path:
    """Every series of a case in one flat folder, files named by a counter (as PACS exports do)."""
    tmp = case_dir.parent / f".{case_dir.name}_tmp"
    n = 0
    for desc, number, value, nz in SERIES:
        paths = write_series(Image(np.full((10, 8, nz), value, np.float32), A), tmp / desc, desc,
                             series_number=number, patient_id=case_dir.name)
        for p in paths:
            n += 1
            dest = case_dir / f"{n:05d}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(p), dest)
    shutil.rmtree(tmp)
    return case_dir


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    for cid in ("PAT01", "PAT02"):
        _export(tmp_path / "exports" / cid)
    return tmp_path / "exports"


def test_patterns_pick_one_series_each_from_a_mixed_folder(data: Path) -> None:
    seq = flat.parse_mapping(SEQ)
    assert detect_layout(data, seq) == "dicom"
    cases = read_dataset(data, seq=seq, strict=True)
    assert [c.id for c in cases] == ["PAT01", "PAT02"]
    c = cases[0]
    assert set(c.sequences) == {"T2w", "ADC", "DWI"} and c.domain == "prostate"
    assert c.sequences["T2w"].options["series_description"] == "t2_tse_tra"  # not the repeat
    for name, value, nz in (("T2w", 100.0, 6), ("ADC", 900.0, 5), ("DWI", 30.0, 5)):
        img = load_sequence(c.sequences[name])
        assert img.shape == (10, 8, nz) and float(img.data.mean()) == value
    rows = inspect(data, seq=seq)
    assert "prostate_report" in rows[0]["tasks"] and rows[0]["layout"] == "dicom"


def test_a_pattern_matching_nothing_or_several_lists_the_series_found(data: Path) -> None:
    with pytest.raises(ToolError) as e:
        read_dataset(data, seq=flat.parse_mapping(["T2w=*t2*cor*", "ADC=*adc*"]), strict=True)
    err = e.value
    assert err.code == ErrorCode.input_missing and err.context["case"] == "PAT01"
    assert "no series matches T2w='*t2*cor*'" in err.message
    assert "#3 't2_tse_tra' (6 files)" in err.message and "#1 'localizer' (3 files)" in err.message
    with pytest.raises(ToolError) as e:
        read_dataset(data, seq=flat.parse_mapping(["T2w=t2_tse_tra*", "ADC=*adc*"]), strict=True)
    assert e.value.code == ErrorCode.schema and "2 series match T2w='t2_tse_tra*'" in e.value.message


def test_without_patterns_every_series_is_kept_under_its_alias(data: Path) -> None:
    c = read_dataset(data, strict=True)[0]
    # prefixes and suffixes through the alias table; three T2 series stay apart, numbered,
    # and the sagittal one (lowest number) is "T2w": the reason to pass --seq patterns
    assert set(c.sequences) == {"localizer", "T2w", "T2w_3", "T2w_4", "ADC", "DWI"}
    assert c.sequences["T2w"].options["series_description"] == "t2_tse_sag"
    assert c.sequences["ADC"].options["series_description"] == "ep2d_diff_b50_800_ADC"


def test_a_missing_slice_is_named_with_case_and_file_when_the_case_is_read(data: Path) -> None:
    import pydicom

    adc = sorted(p for p in (data / "PAT02").iterdir()
                 if pydicom.dcmread(str(p), stop_before_pixels=True).SeriesDescription == "ep2d_diff_b50_800_ADC")
    adc[2].unlink()
    seq = flat.parse_mapping(SEQ)
    with pytest.raises(ToolError) as e:
        read_dataset(data, seq=seq, strict=True)
    err = e.value
    assert err.code == ErrorCode.schema and err.context["case"] == "PAT02" and err.context["sequence"] == "ADC"
    assert "1 slice(s) missing: expected 5 slices" in err.message and err.context["file"] == str(adc[3])
    rows = {r["case"]: r for r in inspect(data, seq=seq)}  # the cohort view: one bad row, one good
    assert rows["PAT02"]["tasks"] == [] and "missing" in rows["PAT02"]["issues"][0]
    assert "prostate_report" in rows["PAT01"]["tasks"]
