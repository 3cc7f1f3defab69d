"""BIDS export from finished case folders (no Ray): subject and session labels of a BIDS input
are kept, predictions and dseg files use the input dataset's label values (BraTS 2023's ET is
3, BraTS 2021's is 4), and the tree passes the official validator."""
from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import nibabel as nib
import numpy as np

from bcer.contracts import Case
from bcer.contracts.artifacts import Image, Mask
from bcer.engine.bids_out import entities
from bcer.engine.derivatives import label_mapping
from bcer.engine.exports import write_derivatives
from bcer.io import write_json, write_nifti

from ._bids_validator import validator_errors

AFFINE = np.diag([-1.5, 1.5, 2.0, 1.0])
BRATS = {1: "necrotic_core", 2: "oedema", 4: "enhancing"}


def labels_volume() -> np.ndarray:
    data = np.zeros((12, 10, 8), np.int16)
    data[2:9, 2:8, 2:6] = 2
    data[4:7, 3:7, 3:5] = 1
    data[5:7, 4:6, 3:5] = 4
    return data


def finished(src: Path, out: Path, case_id: str, rel: str, truth: dict[int, str] | None) -> Case:
    """A BIDS input image and the case folder bcer leaves for it (mask, provenance, _DONE)."""
    image = write_nifti(Image(np.ones((12, 10, 8), np.float32), AFFINE), src / rel)
    folder = out / case_id
    write_nifti(Mask(labels_volume(), AFFINE, {}, labels=dict(BRATS)), folder / "seg.nii.gz")
    rec = {"path": str(image), "format": "nifti", "kind": "image"}
    write_json({"deliverables": {"labels": {"node": "seg", "field": "labels", "files": {"seg.nii.gz": "0"},
                                            "inputs": {"T1c": rec}}}}, folder / "provenance.json")
    (folder / "_DONE").write_text("{}")
    (folder / "plan.json").write_text("{}")
    gt = None
    if truth:
        gt = {"labels": {"seg": {"path": str(image), "format": "nifti", "kind": "mask",
                                 "options": {"labels": {str(k): v for k, v in truth.items()}}}}}
    return Case(id=case_id, root=str(image.parent.parent), layout="bids", ground_truth=gt)


def test_session_labels_kept_and_brats2023_values_restored(tmp_path):
    src, out = tmp_path / "raw", tmp_path / "out"
    case = finished(src, out, "sub-01_ses-02", "sub-01/ses-02/anat/sub-01_ses-02_ce-gd_T1w.nii.gz",
                    {1: "NETC", 2: "SNFH", 3: "ET"})
    write_derivatives(out, [case], generated_by={"Name": "bcer", "Version": "test"}, dicom=False)
    stem = out / "sub-01" / "ses-02" / "anat" / "sub-01_ses-02_desc-labels_dseg"
    dseg = np.asarray(nib.load(stem.with_suffix(".nii.gz")).dataobj)
    truth = labels_volume()
    assert np.array_equal(dseg == 3, truth == 4) and not np.any(dseg == 4)  # ET is 3 in BraTS 2023
    assert np.array_equal(dseg == 1, truth == 1) and np.array_equal(dseg == 2, truth == 2)
    rows = list(csv.DictReader(stem.with_suffix(".tsv").read_text().splitlines(), delimiter="\t"))
    assert {r["index"]: r["name"] for r in rows} == {"0": "background", "1": "necrotic_core", "2": "oedema",
                                                     "3": "enhancing"}
    pred = np.asarray(nib.load(out / "predictions" / "sub-01_ses-02.nii.gz").dataobj)
    assert np.array_equal(pred, dseg)
    side = json.loads(stem.with_suffix(".json").read_text())
    assert side["SpatialReference"] == "bids:raw:sub-01/ses-02/anat/sub-01_ses-02_ce-gd_T1w.nii.gz"
    assert json.loads((out / "dataset_description.json").read_text())["DatasetLinks"]["raw"] == src.resolve().as_uri()
    assert "/sub-01_ses-02" in (out / ".bidsignore").read_text().split()
    assert validator_errors(out) == []


def test_case_folder_named_like_its_subject_is_ignored_file_by_file(tmp_path):
    src, out = tmp_path / "raw", tmp_path / "out"
    case = finished(src, out, "sub-07", "sub-07/anat/sub-07_ce-gd_T1w.nii.gz", dict(BRATS))
    write_derivatives(out, [case], dicom=False)
    assert np.array_equal(np.asarray(nib.load(out / "predictions" / "sub-07.nii.gz").dataobj), labels_volume())
    ignore = (out / ".bidsignore").read_text().split()
    assert {"/sub-07/plan.json", "/sub-07/seg.nii.gz", "/sub-07/_DONE"} <= set(ignore)
    assert (out / "sub-07" / "anat" / "sub-07_desc-labels_dseg.nii.gz").exists()
    assert validator_errors(out) == []


def test_label_mapping_by_region_name():
    plain = Case(id="x", root="/tmp")
    assert label_mapping(BRATS, plain) == {1: 1, 2: 2, 4: 4}  # no label map: bcer's own values
    gt = {"labels": {"seg": {"path": "/x", "options": {"labels": {"1": "NCR", "2": "ED", "3": "ET"}}}}}
    assert label_mapping(BRATS, Case(id="x", root="/tmp", ground_truth=gt)) == {1: 1, 2: 2, 4: 3}
    test_case = Case(id="BraTS-GLI-00001-000", root="/tmp", layout="brats2023")  # no seg: the layout's table
    assert label_mapping(BRATS, test_case) == {1: 1, 2: 2, 4: 3}
    assert label_mapping({1: "gland"}, Case(id="x", root="/tmp", layout="brats2023")) == {1: 1}


def test_entities_and_colliding_labels(tmp_path, caplog):
    assert entities("sub-01_ses-pre") == ("01", "pre") and entities("brain-003") == ("brain003", None)
    src, out = tmp_path / "raw", tmp_path / "out"
    a = finished(src, out, "brain-003", "a/t1.nii.gz", None)
    b = finished(src, out, "brain003", "b/t1.nii.gz", None)
    with caplog.at_level(logging.WARNING):
        write_derivatives(out, [a, b], dicom=False, predictions=False)
    assert [p.name for p in (out / "sub-brain003" / "anat").glob("*.nii.gz")] == ["sub-brain003_desc-labels_dseg.nii.gz"]
    assert "brain003" in caplog.text and "left out" in caplog.text
    assert (out / "participants.tsv").read_text().split() == ["participant_id", "sub-brain003"]
