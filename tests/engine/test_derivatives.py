"""Standard derivatives end to end: a DICOM prostate cohort run on Ray exports a BIDS derivative
dataset that the official validator accepts and pybids indexes, flat predictions, and DICOM
SEG + TID 1500 SR whose values and references match the NIfTI and JSON deliverables."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

import bcer
from bcer.datasets.synth import synth_cohort

from ._bids_validator import validator_errors

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def prostate_run(ray_local, tmp_path_factory):
    root = tmp_path_factory.mktemp("derivatives")
    cases = synth_cohort("prostate", 1, root / "in", layout="dicom", seed=0, size="small")
    result = bcer.Study(cases, task="prostate_report", out=root / "out").run()
    assert result.cases.column("status").to_pylist() == ["succeeded"]
    return root / "out", cases[0]


def test_bids_tree_passes_the_official_validator_and_pybids_reads_it(prostate_run):
    out, case = prostate_run
    assert validator_errors(out) == []
    import bids

    layout = bids.BIDSLayout(str(out), validate=False, is_derivative=True)
    assert layout.get_subjects() == ["prostates0000"]
    (dseg,) = layout.get(desc="gland", suffix="dseg", extension=".nii.gz")
    gland = nib.load(out / case.id / "gland.nii.gz")
    assert np.array_equal(np.asarray(nib.load(dseg.path).dataobj), np.asarray(gland.dataobj))
    tsv = Path(dseg.path).with_name(dseg.filename.replace(".nii.gz", ".tsv"))
    table = list(csv.DictReader(tsv.read_text().splitlines(), delimiter="\t"))
    assert table == [{"index": "0", "name": "background"}, {"index": "1", "name": "gland"}]
    side = json.loads(Path(dseg.path.replace(".nii.gz", ".json")).read_text())
    assert side["SpatialReference"] == f"bids:raw:{case.id}/AX_T2"  # the series the mask lies on
    assert f"bids:raw:{case.id}/AX_T2" in side["Sources"]
    desc = json.loads((out / "dataset_description.json").read_text())
    assert desc["GeneratedBy"][0]["Version"] == bcer.__version__ and desc["DatasetLinks"]["raw"].startswith("file:")
    feats = json.loads((out / case.id / "features.json").read_text())["rows"][0]
    (row,) = csv.DictReader((out / "phenotype" / "features.tsv").read_text().splitlines(), delimiter="\t")
    assert row["participant_id"] == "sub-prostates0000"
    assert float(row["volume_ml"]) == pytest.approx(feats["volume_ml"], rel=1e-5)
    # the validator does check this tree: without .bidsignore bcer's own files are errors
    ignore = (out / ".bidsignore").read_text()
    (out / ".bidsignore").unlink()
    try:
        assert ("NOT_INCLUDED", f"/{case.id}") in {(c, (loc or "").rstrip("/")) for c, loc in validator_errors(out)}
    finally:
        (out / ".bidsignore").write_text(ignore)
    # the lean case folder: deliverables, provenance and _DONE holding the row; the trace is in events.parquet
    assert (out / case.id / "provenance.json").exists() and not (out / case.id / "events.jsonl").exists()
    assert json.loads((out / case.id / "_DONE").read_text())["status"] == "succeeded"
    assert (out / "events.parquet").exists()


def test_predictions_are_flat_and_equal_the_case_mask(prostate_run):
    out, case = prostate_run
    pred = nib.load(out / "predictions" / f"{case.id}.nii.gz")
    gland = nib.load(out / case.id / "gland.nii.gz")
    assert np.array_equal(np.asarray(pred.dataobj), np.asarray(gland.dataobj))
    assert np.allclose(pred.affine, gland.affine)


def test_dicom_seg_and_sr_match_the_nifti_and_reference_the_source_series(prostate_run):
    import highdicom as hd
    import pydicom

    from bcer.io.dicom_sr import read_measurements

    out, case = prostate_run
    t2_uid = case.sequences["T2w"].options["series_uid"]
    src = pydicom.dcmread(next(Path(case.sequences["T2w"].path).glob("*.dcm")), stop_before_pixels=True)
    seg = hd.seg.segread(out / "dicom" / case.id / "gland_seg.dcm")
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == t2_uid
    assert seg.FrameOfReferenceUID == src.FrameOfReferenceUID and seg.StudyInstanceUID == src.StudyInstanceUID
    assert seg.SegmentSequence[0].SegmentLabel == "gland"
    uids = [r.ReferencedSOPInstanceUID for r in seg.ReferencedSeriesSequence[0].ReferencedInstanceSequence]
    frames = seg.get_pixels_by_source_instance(source_sop_instance_uids=uids, segment_numbers=[1])
    gland = np.asarray(nib.load(out / case.id / "gland.nii.gz").dataobj)
    assert int(frames.sum()) == int(np.count_nonzero(gland))  # same grid: every voxel lands once

    sr_path = out / "dicom" / case.id / "measurements_sr.dcm"
    values = read_measurements(sr_path)
    feats = json.loads((out / case.id / "features.json").read_text())["rows"][0]
    lesion = json.loads((out / case.id / "lesions.json").read_text())["items"][0]
    pirads = json.loads((out / case.id / "pirads.json").read_text())["label"]
    assert values["features.gland"]["Volume"] == pytest.approx(feats["volume_ml"])
    assert values["features.gland"]["Diameter"] == pytest.approx(feats["max_diameter_mm"])
    got = values[lesion["id"]]
    assert got["Volume"] == pytest.approx(lesion["volume_ml"])
    assert got["Apparent Diffusion Coefficient"] == pytest.approx(lesion["attributes"]["adc"])
    assert got["Diameter"] == pytest.approx(lesion["attributes"]["size_mm"])
    assert values["pirads"]["pirads_category"] == float(pirads.split()[-1])
    sr = hd.sr.srread(sr_path)
    (group,) = sr.content.get_volumetric_roi_measurement_groups()
    ref = group.referenced_segment
    assert ref.referenced_sop_instance_uid == seg.SOPInstanceUID
    assert t2_uid in {s.SeriesInstanceUID for s in sr.CurrentRequestedProcedureEvidenceSequence[0].ReferencedSeriesSequence}
