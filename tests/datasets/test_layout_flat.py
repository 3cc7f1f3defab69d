"""Flat NIfTI folders: names by ending or by --seq patterns, typed errors, phantom round trip."""
from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.layouts import detect_layout, read_dataset
from bcer.datasets.layouts import flat
from bcer.io import load_sequence


def _nii(path: Path, shape=(8, 9, 5), value: float = 1.0, affine=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.full(shape, value, np.float32)
    data[0, 0, 0] = value + 1  # not constant
    nib.save(nib.Nifti1Image(data, np.diag([1.5, 1.5, 3.0, 1.0]) if affine is None else affine), str(path))
    return path


def test_names_ending_in_sequence_words_are_read_without_a_mapping(tmp_path: Path) -> None:
    for case in ("BraTS-017", "BraTS-018"):
        for i, word in enumerate(("t1", "t1ce", "T2", "flair", "seg")):
            _nii(tmp_path / f"{case}_{word}.nii.gz", value=10.0 * (i + 1))
    assert detect_layout(tmp_path) == "flat"
    cases = read_dataset(tmp_path, strict=True)
    assert [c.id for c in cases] == ["BraTS-017", "BraTS-018"]
    c = cases[0]
    assert c.domain == "brain" and set(c.sequences) == {"T1", "T1c", "T2", "FLAIR"} and c.layout == "flat"
    assert c.ground_truth["labels"]["seg"]["path"].endswith("BraTS-017_seg.nii.gz")
    assert float(np.median(load_sequence(c.sequences["T1c"]).data)) == 20.0  # t1ce is T1c, not T1


def test_seq_patterns_name_sequences_and_the_case_id_is_the_wildcard(tmp_path: Path) -> None:
    for case in ("p01", "p02"):
        _nii(tmp_path / f"{case}-native.nii.gz", value=1)
        _nii(tmp_path / "t2dir" / f"{case}.nii.gz", value=2)
        _nii(tmp_path / f"{case}-dark_fluid.nii.gz", value=3)
    _nii(tmp_path / "README_scan.nii.gz")  # matched by no pattern: ignored
    with pytest.raises(ToolError) as e:  # endings that are no sequence words: ask for --seq
        read_dataset(tmp_path, strict=True)
    assert e.value.code == ErrorCode.schema and "--seq" in e.value.hint
    seq = flat.parse_mapping(["T1=*-native.nii.gz", "t2=t2dir/*.nii.gz", "FLAIR=*-dark_fluid.nii.gz"])
    cases = read_dataset(tmp_path, seq=seq, strict=True)
    assert [c.id for c in cases] == ["p01", "p02"]
    assert set(cases[1].sequences) == {"T1", "T2", "FLAIR"} and cases[1].domain == "brain"
    assert cases[1].sequences["T2"].path.endswith("t2dir/p02.nii.gz")


def test_ambiguous_mappings_missing_channels_and_grids_are_typed(tmp_path: Path) -> None:
    for case in ("a", "b"):
        _nii(tmp_path / f"{case}_t1.nii.gz")
        _nii(tmp_path / f"{case}_t1ce.nii.gz")
    with pytest.raises(ToolError) as e:  # *_t1*.nii.gz also claims the t1ce files
        read_dataset(tmp_path, seq={"T1": "*_t1*.nii.gz", "T1c": "*_t1ce.nii.gz"}, strict=True)
    assert e.value.code == ErrorCode.schema and "matches both" in e.value.message
    twice = tmp_path / "twice"
    _nii(twice / "a_t1.nii.gz")
    _nii(twice / "a_t1.nii")
    with pytest.raises(ToolError) as e:  # two files for one case and sequence
        read_dataset(twice, strict=True)
    assert e.value.code == ErrorCode.schema and "two files" in e.value.message
    with pytest.raises(ToolError) as e:  # no wildcard: no case id
        read_dataset(tmp_path, seq={"T1": "a_t1.nii.gz"}, strict=True)
    assert e.value.code == ErrorCode.schema and "wildcard" in e.value.message
    with pytest.raises(ToolError) as e:
        flat.parse_mapping(["T1:*_t1.nii.gz"])
    assert e.value.code == ErrorCode.schema
    with pytest.raises(ToolError) as e:
        read_dataset(tmp_path, seq={"T3": "*_t1.nii.gz"}, strict=True)
    assert e.value.code == ErrorCode.schema and "not a sequence" in e.value.message

    _nii(tmp_path / "c_t1.nii.gz")  # case c lacks T1c
    _nii(tmp_path / "b_flair.nii.gz", shape=(8, 9, 6))  # case b: FLAIR on another grid
    seq = {"T1": "*_t1.nii.gz", "T1c": "*_t1ce.nii.gz"}
    with pytest.raises(ToolError) as e:
        read_dataset(tmp_path, seq=seq, strict=True)
    assert e.value.code == ErrorCode.input_missing and e.value.context["case"] == "c" and "T1c" in e.value.message
    cases = {c.id: c for c in read_dataset(tmp_path, seq=dict(seq, FLAIR="*_flair.nii.gz"))}  # lenient (cohorts)
    assert cases["a"].issues[0]["code"] == "input_missing" and "FLAIR" in cases["a"].issues[0]["message"]
    assert cases["b"].issues[0]["code"] == "shape" and "FLAIR" in cases["b"].issues[0]["message"]
    assert cases["c"].issues[0]["code"] == "input_missing"


def test_prostate_adc_keeps_its_own_grid_and_t2_is_read_as_t2w(tmp_path: Path) -> None:
    _nii(tmp_path / "pr1_t2.nii.gz", shape=(20, 20, 8))
    _nii(tmp_path / "pr1_adc.nii.gz", shape=(10, 10, 8))
    (case,) = read_dataset(tmp_path, strict=True)
    assert case.domain == "prostate" and set(case.sequences) == {"T2w", "ADC"}


def test_phantom_cohort_round_trip_keeps_truth(tmp_path: Path) -> None:
    from bcer.datasets.synth import synth_cohort

    cases = synth_cohort("brain", 1, tmp_path / "flat", layout="flat", seed=4)
    (c,) = cases
    assert set(c.sequences) == {"T1", "T1c", "T2", "FLAIR"} and c.domain == "brain"
    assert c.ground_truth["values"]["grade"] in ("HGG", "LGG") and "seg" in c.ground_truth["labels"]
    assert not flat.detect(tmp_path / "flat" / "bcer_truth")  # truth is no dataset of its own
