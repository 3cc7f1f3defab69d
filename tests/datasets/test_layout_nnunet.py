"""nnU-Net v2 raw and MSD datasets: channel names, _XXXX files, 4-D MSD files, typed errors."""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.layouts import detect_layout, flat, read_dataset
from bcer.io import load_sequence

AFF = np.diag([1.0, 1.0, 2.0, 1.0])


def _nii(path: Path, data: np.ndarray, affine=AFF) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, affine), str(path))


def _v2(root: Path, channel_names: dict, cases=("BRATS_001", "BRATS_002"), test=("BRATS_101",),
        shape=(10, 9, 6)) -> Path:
    (root).mkdir(parents=True, exist_ok=True)
    (root / "dataset.json").write_text(json.dumps({
        "channel_names": channel_names, "numTraining": len(cases), "file_ending": ".nii.gz",
        "labels": {"background": 0, "edema": 1, "non-enhancing tumor": 2, "enhancing tumour": 3}}))
    rng = np.random.default_rng(0)
    for split, ids in (("imagesTr", cases), ("imagesTs", test)):
        for cid in ids:
            for i in range(len(channel_names)):
                _nii(root / split / f"{cid}_{i:04d}.nii.gz", (rng.random(shape) + i).astype(np.float32))
            if split == "imagesTr":
                _nii(root / "labelsTr" / f"{cid}.nii.gz", rng.integers(0, 4, shape).astype(np.int16))
    return root


MSD_BRAIN = {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"}


def test_v2_channels_map_to_sequences_by_name(tmp_path: Path) -> None:
    root = _v2(tmp_path / "Dataset001_BrainTumour", MSD_BRAIN)
    assert detect_layout(root) == "nnunet" and not flat.detect(root / "imagesTr")
    cases = {c.id: c for c in read_dataset(root, strict=True)}
    assert set(cases) == {"BRATS_001", "BRATS_002", "BRATS_101"}
    c = cases["BRATS_001"]
    assert c.domain == "brain" and c.layout == "nnunet" and c.metadata["split"] == "train"
    assert set(c.sequences) == {"FLAIR", "T1", "T1c", "T2"}  # T1w -> T1, t1gd -> T1c, T2w -> T2 (brain)
    assert c.sequences["T1c"].path.endswith("BRATS_001_0002.nii.gz")
    assert c.ground_truth["labels"]["seg"]["options"]["labels"] == {"1": "edema", "2": "non-enhancing tumor",
                                                                    "3": "enhancing tumour"}
    assert cases["BRATS_101"].metadata["split"] == "test" and cases["BRATS_101"].ground_truth is None


def test_msd_4d_files_are_read_channel_by_channel(tmp_path: Path) -> None:
    root = tmp_path / "Task05_Prostate"
    (root / "imagesTr").mkdir(parents=True)
    (root / "dataset.json").write_text(json.dumps({
        "name": "PROSTATE", "modality": {"0": "T2", "1": "ADC"}, "labels": {"0": "background", "1": "PZ", "2": "TZ"},
        "training": [{"image": "./imagesTr/prostate_00.nii.gz", "label": "./labelsTr/prostate_00.nii.gz"}]}))
    data = np.stack([np.full((6, 7, 4), 100.0), np.full((6, 7, 4), 900.0)], axis=-1).astype(np.float32)
    _nii(root / "imagesTr" / "prostate_00.nii.gz", data)
    _nii(root / "labelsTr" / "prostate_00.nii.gz", np.ones((6, 7, 4), np.int16))
    (c,) = read_dataset(root, strict=True)
    assert c.domain == "prostate" and set(c.sequences) == {"T2w", "ADC"}  # T2 is T2w for prostate
    assert c.sequences["ADC"].options == {"channel": 1}
    adc = load_sequence(c.sequences["ADC"])
    assert adc.data.shape == (6, 7, 4) and float(adc.data.mean()) == 900.0
    assert c.ground_truth["labels"]["seg"]["options"]["labels"] == {"1": "PZ", "2": "TZ"}


def test_typed_errors(tmp_path: Path) -> None:
    root = _v2(tmp_path / "d", {"0": "T2", "1": "MRI"}, cases=("x1",), test=())
    with pytest.raises(ToolError) as e:
        read_dataset(root, strict=True)
    assert e.value.code == ErrorCode.schema and "MRI" in e.value.message and "--seq" in e.value.hint
    (c,) = read_dataset(root, seq={"ADC": "1"}, strict=True)  # name the unknown channel by index
    assert set(c.sequences) == {"T2w", "ADC"}
    with pytest.raises(ToolError) as e:
        read_dataset(root, seq={"ADC": "7"}, strict=True)
    assert e.value.code == ErrorCode.schema

    root = _v2(tmp_path / "dup", {"0": "T1", "1": "T1w"}, cases=("x1",), test=())
    with pytest.raises(ToolError) as e:
        read_dataset(root, strict=True)
    assert e.value.code == ErrorCode.schema and "twice" in e.value.message

    root = _v2(tmp_path / "gaps", MSD_BRAIN, cases=("x1", "x2", "x3"), test=())
    (root / "imagesTr" / "x1_0003.nii.gz").unlink()
    _nii(root / "imagesTr" / "x2_0001.nii.gz", np.ones((10, 9, 7), np.float32))
    _nii(root / "imagesTr" / "x3_0004.nii.gz", np.ones((10, 9, 6), np.float32))
    with pytest.raises(ToolError) as e:
        read_dataset(root, strict=True)
    assert e.value.code == ErrorCode.input_missing and e.value.context["case"] == "x1" and "0003" in e.value.message
    issues = {c.id: c.issues[0] for c in read_dataset(root)}  # lenient: each case keeps its own error
    assert issues["x1"]["code"] == "input_missing"
    assert issues["x2"]["code"] == "shape"
    assert issues["x3"]["code"] == "schema" and "0004" in issues["x3"]["message"]

    (tmp_path / "nojson" / "imagesTr").mkdir(parents=True)
    with pytest.raises(ToolError) as e:
        read_dataset(tmp_path / "nojson", layout="nnunet", strict=True)
    assert e.value.code == ErrorCode.schema and "dataset.json" in e.value.message


def test_phantom_round_trip_puts_channels_on_one_grid(tmp_path: Path) -> None:
    from bcer.datasets.synth import synth_cohort

    (c,) = synth_cohort("prostate", 1, tmp_path / "nn", layout="nnunet", seed=2)
    assert c.domain == "prostate" and set(c.sequences) == {"T2w", "ADC", "DWI"}
    desc = json.loads((tmp_path / "nn" / "dataset.json").read_text())
    assert desc["channel_names"] == {"0": "T2w", "1": "ADC", "2": "DWI"} and desc["labels"]["PZ"] == 1
    t2, adc = load_sequence(c.sequences["T2w"]), load_sequence(c.sequences["ADC"])
    assert adc.data.shape == t2.data.shape and np.allclose(adc.affine, t2.affine)
    assert c.ground_truth["values"] and "zones" in c.ground_truth["labels"]
